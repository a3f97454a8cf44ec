"""``aionet keys DIR``: key material for a test cluster (token, TLS CA and certificate, CurveZMQ)."""

from __future__ import annotations

import click


@click.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--host", "hosts", multiple=True, help="Extra DNS name or IP for the node certificate (repeatable).")
@click.option("--days", default=365, show_default=True, help="Certificate validity in days.")
@click.option("--force", is_flag=True, help="Replace key files that already exist in DIRECTORY.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "cryptography", "openssl"]),
    default="auto",
    show_default=True,
    help="How TLS certificates are made.",
)
def keys(directory: str, hosts: tuple[str, ...], days: int, force: bool, backend: str) -> None:
    """Generate key material for a test cluster into DIRECTORY and print the config to use it.

    Writes a random cluster token (mode 0600), a self-signed CA, one node certificate and key
    for TLS (valid as server and client, for localhost, this host and every --host) and a
    CurveZMQ key pair. Every node of the test cluster uses the same files."""
    from ..security.keys import KeygenError, generate

    try:
        ks = generate(directory, hosts=list(hosts), days=days, force=force, backend=backend)
    except KeygenError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{directory}: {exc.strerror or exc}") from None
    click.echo(f"# wrote to {ks.directory} (TLS via {ks.tls_backend}); keep *.key, token and curve.secret private")
    click.echo("# add to every node's config file:")
    click.echo(ks.config_snippet(), nl=False)
