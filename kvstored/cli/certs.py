"""``kvstored certs init DIR``: a small CA and the certificates of a test cluster
(kvstored/security/certs.py has the layout; docs/security.md how to use them)."""

from __future__ import annotations

import sys

import click

from kvstored.errors import InvalidArgument


def _names(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


@click.group()
def certs() -> None:
    """Certificates for mutual TLS (test clusters)."""


@certs.command("init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--nodes", default="node1", show_default=True, metavar="A,B",
              help="Node names: one certificate each with role node.")
@click.option("--engines", default="engine1", show_default=True, metavar="E1,E2",
              help="Engine names: role engine (and --tenant).")
@click.option("--admins", default="admin", show_default=True, metavar="OPS",
              help="Admin names: role admin (kvstorectl evict).")
@click.option("--tenant", default="", help="Tenant the engine certificates carry (none by default).")
@click.option("--hosts", default="localhost,127.0.0.1,::1", show_default=True, metavar="H1,H2",
              help="DNS names / IPs every certificate is valid for (what clients dial).")
@click.option("--valid-days", type=int, default=365, show_default=True)
def init(directory: str, nodes: str, engines: str, admins: str, tenant: str, hosts: str,
         valid_days: int) -> None:
    """Make DIR/ca.pem, master.pem, node-NAME.pem, engine-NAME.pem, admin-NAME.pem (and
    their .key files, mode 0600). Never overwrites an existing CA."""
    from kvstored.security.certs import init_cluster_certs

    try:
        written = init_cluster_certs(directory, nodes=_names(nodes), engines=_names(engines),
                                     admins=_names(admins), tenant=tenant, hosts=_names(hosts),
                                     valid_days=valid_days)
    except InvalidArgument as exc:
        click.echo(f"kvstored certs init: {exc}", err=True)
        sys.exit(2)
    for path in written:
        click.echo(str(path))
