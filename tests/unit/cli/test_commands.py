"""The lazy subcommand table of aionet.cli."""

import click
import pytest

from aionet.cli import SUBCOMMANDS, LazyGroup, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_table_entry_is_the_command_of_that_name(name):
    cmd = main.get_command(click.Context(main), name)
    assert isinstance(cmd, click.Command) and cmd.name == name


def test_listing_is_sorted_and_complete():
    assert main.list_commands(click.Context(main)) == sorted(SUBCOMMANDS)


def test_a_wrong_entry_says_where():
    group = LazyGroup(name="g", lazy_subcommands={"x": "config:load_config"})
    with pytest.raises(TypeError, match="aionet.cli.config:load_config is function, not a click command"):
        group.get_command(click.Context(group), "x")


def test_unknown_name_is_none():
    assert main.get_command(click.Context(main), "nope") is None
