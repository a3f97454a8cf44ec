"""The package version, in a module of its own so that light importers (the CLI) need not load the Node."""

__version__ = "0.1.0"
