"""``kvstored``: the daemon command group (``kvstored serve``; ``demo``, ``replay``, ``calibrate``).

Commands from other packages are imported lazily, only when invoked (or listed by --help), so
``kvstored serve`` never imports torch.

``kvstored serve`` prints where it listens, one line per address, then ``ready``::

    kvstored node myhost epoch 1732870000000000000
    listening grpc unix:/run/user/1000/kvstored/node.sock
    listening grpc 127.0.0.1:7070
    listening data 127.0.0.1:7071
    listening metrics http://127.0.0.1:7072/metrics
    arena /dev/shm/kvstored-myhost-4242.arena 1.0 GiB
    ssd /home/me/.local/share/kvstored/ssd 4.0 GiB
    ready
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from kvstored.errors import ConfigInvalid, InvalidArgument, KvstoredError

# name -> "module:attribute" of commands owned by other packages (optional, imported lazily)
LAZY_COMMANDS: dict[str, str] = {
    "demo": "kvstored.demo.cli:demo",
    "replay": "kvstored.scheduler.cli:replay",
    "calibrate": "kvstored.scheduler.cli:calibrate",
    "certs": "kvstored.cli.certs:certs",
}


class LazyGroup(click.Group):
    """A click group whose optional commands are imported only when needed."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def _available(self, name: str) -> bool:
        module = self.lazy_commands[name].split(":")[0]
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    def list_commands(self, ctx: click.Context) -> list[str]:
        lazy = [n for n in self.lazy_commands if n not in self.commands and self._available(n)]
        return sorted([*super().list_commands(ctx), *lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in self.lazy_commands:
            return cmd
        module_name, attr = self.lazy_commands[cmd_name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return None
        found = getattr(module, attr, None) or getattr(module, f"{attr}_command", None)
        return found if isinstance(found, click.Command) else None


@click.group(cls=LazyGroup, lazy_commands=LAZY_COMMANDS)
@click.version_option(package_name="kvstored", message="%(prog)s %(version)s")
def main() -> None:
    """kvstored: a tiered, content-addressed store of LLM KV-cache blocks."""


def _print_started(daemon: Any) -> None:
    from kvstored.units import format_size

    cfg = daemon.cfg
    lines = [f"kvstored node {cfg.node_id} epoch {daemon.epoch}"]
    lines += [f"listening grpc {addr}" for addr in daemon.grpc_addresses]
    if daemon.data_address:
        lines.append(f"listening data {daemon.data_address}")
    if daemon.metrics_address:
        lines.append(f"listening metrics http://{daemon.metrics_address}/metrics")
    store = daemon.store
    lines.append(f"arena {daemon.arena_path or '(anonymous)'} {format_size(store.arena_size_bytes)}")
    if cfg.ssd_dir is not None and cfg.ssd_size_bytes > 0:
        lines.append(f"ssd {cfg.ssd_dir} {format_size(cfg.ssd_size_bytes)}")
    else:
        lines.append("ssd disabled")
    lines.append("ready")
    click.echo("\n".join(lines))
    sys.stdout.flush()


_TLS_FLAGS = {"cert_file": "--tls-cert", "key_file": "--tls-key", "ca_file": "--tls-ca"}
"""TlsConfig field -> the flag that sets it (config errors name the flag)."""


def tls_options(fn: Any) -> Any:
    """``--tls-cert/--tls-key/--tls-ca`` (the ``[tls]`` section; all three, or none)."""
    for flag, help_text in reversed([
        ("--tls-cert", "PEM certificate this daemon presents (tls.cert_file): mutual TLS on "
                       "every TCP listener and the data plane."),
        ("--tls-key", "Its private key (tls.key_file)."),
        ("--tls-ca", "CA a peer's certificate must chain to (tls.ca_file)."),
    ]):
        fn = click.option(flag, metavar="PEM", default=None, help=help_text)(fn)
    return fn


def _tls_overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the ``tls_*`` flags out of a command's kwargs as a ``[tls]`` override dict."""
    return {field: kwargs.pop(f"tls_{field.removesuffix('_file')}", None) for field in _TLS_FLAGS}


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML config file ([node] section).")
@click.option("--listen", multiple=True, metavar="unix:PATH|HOST:PORT",
              help="gRPC listen address; repeat for several (replaces node.listen).")
@click.option("--dram-size", metavar="SIZE", help="DRAM tier (arena) size, e.g. 1GiB.")
@click.option("--ssd-dir", metavar="DIR", help="SSD tier directory.")
@click.option("--ssd-size", metavar="SIZE", help="SSD tier cap, e.g. 4GiB; 0 disables the tier.")
@click.option("--data-address", metavar="HOST:PORT", help="TCP data-plane address (port 0 = any).")
@click.option("--metrics-address", metavar="HOST:PORT",
              help="Prometheus /metrics address; '' disables it.")
@click.option("--node-id", help="Node name (default: host name).")
@click.option("--arena-dir", metavar="DIR", help="tmpfs directory of the arena file.")
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines (systemd).")
@click.option("--log-format", type=click.Choice(["json", "console"]),
              help="Log lines as JSON (journald) or for a console; wins over --log-json.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--master-listen", metavar="HOST:PORT",
              help="Also host the cluster's master in this process, listening here (other "
                   "hosts join with `kvstored node --master HOST:PORT`); off by default.")
@tls_options
def serve(
    config_path: str | None,
    listen: tuple[str, ...],
    dram_size: str | None,
    ssd_dir: str | None,
    ssd_size: str | None,
    data_address: str | None,
    metrics_address: str | None,
    node_id: str | None,
    arena_dir: str | None,
    log_json: bool | None,
    log_format: str | None,
    log_level: str | None,
    master_listen: str | None,
    **tls_flags: str | None,
) -> None:
    """Run the node daemon until SIGTERM/SIGINT (then drain and exit 0).

    Settings: defaults < --config TOML < KVSTORED_NODE__* env vars < these flags. With
    ``[cluster] master_address`` set (file or KVSTORED_CLUSTER__MASTER_ADDRESS) the node
    joins that master, as ``kvstored node --master`` does. With --master-listen the process
    also runs the master (its [master] settings from the same file) and the node joins it.
    """
    overrides = {
        "listen": list(listen) or None, "dram_size_bytes": dram_size, "ssd_dir": ssd_dir,
        "ssd_size_bytes": ssd_size, "data_address": data_address,
        "metrics_address": metrics_address, "node_id": node_id, "arena_dir": arena_dir,
        "log_json": log_json, "log_format": log_format, "log_level": log_level,
    }
    _run_node(config_path, overrides, {}, master_listen=master_listen,
              tls_overrides=_tls_overrides(tls_flags))


_NODE_FLAGS = {
    "listen": "--listen", "dram_size_bytes": "--dram-size", "ssd_dir": "--ssd-dir",
    "ssd_size_bytes": "--ssd-size", "data_address": "--data-address",
    "metrics_address": "--metrics-address", "node_id": "--node-id", "arena_dir": "--arena-dir",
    "log_json": "--log-json", "log_format": "--log-format", "log_level": "--log-level",
    "zone": "--zone",
}
"""NodeConfig field -> the flag that sets it (config errors name the flag)."""


def _check_master_address(spec: str, from_flag: bool) -> None:
    """Exit 2 with a message naming the setting (and ``--master`` when the flag set it) if
    ``cluster.master_address`` is not a master address, before anything is created (the
    DRAM arena, the SSD tier's files)."""
    if not spec:
        return
    from kvstored.transport.master_targets import parse_master_targets

    what = "cluster.master_address (flag --master)" if from_flag else "cluster.master_address"
    try:
        parse_master_targets(spec, what)
    except InvalidArgument as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)


def _run_node(config_path: str | None, overrides: dict[str, Any],
              cluster_overrides: dict[str, Any], *, master_listen: str | None = None,
              tls_overrides: dict[str, Any] | None = None) -> None:
    """Load the config and run a NodeDaemon (``serve``; ``node`` adds the master link;
    ``serve --master-listen`` runs a MasterDaemon in the same loop first)."""
    from kvstored.config import load_config
    from kvstored.log import bind_process, configure

    master_overrides = {"listen": [master_listen]} if master_listen is not None else {}
    try:
        loaded = load_config(
            config_path, overrides={"node": overrides, "cluster": cluster_overrides,
                                    "master": master_overrides, "tls": tls_overrides or {}},
            override_sources={f"node.{k}": v for k, v in _NODE_FLAGS.items()}
            | {f"tls.{k}": v for k, v in _TLS_FLAGS.items()}
            | {"cluster.master_address": "--master", "master.listen": "--master-listen"},
        )
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    _check_master_address(loaded.cluster.master_address, "master_address" in cluster_overrides)
    cfg = loaded.node
    configure(json=cfg.log_as_json, level=cfg.log_level)
    bind_process(node_id=cfg.node_id)
    import structlog

    structlog.get_logger(__name__).info("config_loaded", **cfg.model_dump(mode="json"))
    from kvstored.node.daemon import NodeDaemon

    try:
        if master_listen is not None:
            asyncio.run(_serve_with_master(loaded))
        else:  # an empty cluster.master_address (the default) is a standalone node
            asyncio.run(NodeDaemon(
                cfg, cluster=loaded.cluster, tenant_quotas=loaded.tenant_quotas(),
                tls=_tls_of(loaded), rdma=loaded.rdma,
            ).run(on_started=_print_started))
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    except KvstoredError as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(1)


def _tls_of(loaded: Any) -> Any:
    """The ``[tls]`` files of a loaded config (read and checked), or None without TLS.

    Raises:
        ConfigInvalid: a file is unreadable, not PEM, or the key does not match the cert.
    """
    from kvstored.security.tls import TlsFiles

    return TlsFiles.from_config(loaded.tls)


async def _serve_with_master(loaded: Any) -> None:
    """``serve --master-listen``: a MasterDaemon, then a NodeDaemon joined to it, one loop.

    The node stops first (it unregisters, drains and spills), then the master.
    """
    from kvstored.addresses import format_host_port, parse_host_port
    from kvstored.master.daemon import MasterDaemon
    from kvstored.node.daemon import NodeDaemon

    tls = _tls_of(loaded)
    master = MasterDaemon(loaded.master, tls=tls)
    await master.start()
    try:
        host, port = parse_host_port(master.grpc_addresses[0])
        if host in ("0.0.0.0", "::"):  # the node dials it: a wildcard is not an address
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        cluster = loaded.cluster.model_copy(update={"master_address": format_host_port(host, port)})
        lines = [f"kvstored master epoch {master.epoch}"]
        lines += [f"listening master {a}" for a in master.grpc_addresses]
        if master.metrics_address:
            lines.append(f"listening master-metrics http://{master.metrics_address}/metrics")
        if master.events_address:
            lines.append(f"listening master-events {master.events_address}")
        if master.events_replay_address:
            lines.append(f"listening master-events-replay {master.events_replay_address}")
        click.echo("\n".join(lines))
        await NodeDaemon(
            loaded.node, cluster=cluster, tenant_quotas=loaded.tenant_quotas(), tls=tls,
            rdma=loaded.rdma,
        ).run(on_started=_print_started)
    finally:
        await master.stop()


@click.option("--master", "master_address", required=True, metavar="HOST:PORT",
              help="Address of the kvstored master to join: HOST:PORT, several as "
                   "HOST:PORT,HOST:PORT (the leader is followed), or etcd://HOST:PORT/PREFIX.")
@click.option("--zone", metavar="ZONE",
              help="This node's failure domain (node.zone): replicas of one block go to "
                   "distinct zones first.")
def _node_command(config_path: str | None, master_address: str, **kwargs: Any) -> None:
    """Run a node daemon that joins a cluster (every flag of ``serve``, plus --master).

    It registers with the master, reports its inventory and changes, and heartbeats; losing
    the master never stops it serving its own blocks.
    """
    tls = _tls_overrides(kwargs)
    overrides = {
        "listen": list(kwargs.pop("listen")) or None,
        **{("dram_size_bytes" if k == "dram_size" else "ssd_size_bytes" if k == "ssd_size"
            else k): v for k, v in kwargs.items()},
    }
    _run_node(config_path, overrides, {"master_address": master_address}, tls_overrides=tls)


node = click.Command(
    "node", callback=_node_command, help=_node_command.__doc__,
    params=[*(p for p in serve.params if p.name != "master_listen"),
            *getattr(_node_command, "__click_params__", [])],
)
main.add_command(node)


def _print_master_started(daemon: Any) -> None:
    lines = [f"kvstored master epoch {daemon.epoch}"]
    if daemon.elector is not None:
        lines.append(f"electing through etcd {','.join(daemon.elector.endpoints)} "
                     f"key {daemon.elector.key.decode()}")
    lines += [f"listening grpc {addr}" for addr in daemon.grpc_addresses]
    if daemon.metrics_address:
        lines.append(f"listening metrics http://{daemon.metrics_address}/metrics")
    if daemon.events_address:
        lines.append(f"listening events {daemon.events_address}")
    if daemon.events_replay_address:
        lines.append(f"listening events-replay {daemon.events_replay_address}")
    lines.append("ready")
    click.echo("\n".join(lines))
    sys.stdout.flush()


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML config file ([master] section).")
@click.option("--listen", multiple=True, metavar="HOST:PORT",
              help="gRPC listen address; repeat for several (replaces master.listen).")
@click.option("--data-dir", metavar="DIR", help="Directory of the master's state file.")
@click.option("--node-lease-s", type=float, help="Node lease, seconds (default 10).")
@click.option("--placement-policy", type=click.Choice(["local-first", "most-free", "random"]))
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="Prometheus /metrics address (port 0 = any); '' disables it (the default).")
@click.option("--etcd", metavar="URL[,URL...]",
              help="Elect the leader through this etcd (http://HOST:PORT, comma-separated); "
                   "without it this master runs alone.")
@click.option("--election-prefix", metavar="PFX",
              help="etcd key prefix of the election (default /kvstored).")
@click.option("--election-lease-s", type=int, help="Leader's etcd lease TTL, seconds (default 5).")
@click.option("--events-endpoint", metavar="tcp://HOST:PORT",
              help="Publish KV events for routers (vLLM's format) on this ZeroMQ PUB address "
                   "(port 0 = any); '' disables it (the default).")
@click.option("--events-replay-endpoint", metavar="tcp://HOST:PORT",
              help="ZeroMQ ROUTER address replaying buffered KV-event batches.")
@click.option("--log-json/--no-log-json", default=None, help="JSON log lines (systemd).")
@click.option("--log-format", type=click.Choice(["json", "console"]),
              help="Log lines as JSON (journald) or for a console; wins over --log-json.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@tls_options
def master(
    config_path: str | None,
    listen: tuple[str, ...],
    data_dir: str | None,
    node_lease_s: float | None,
    placement_policy: str | None,
    metrics_listen: str | None,
    etcd: str | None,
    election_prefix: str | None,
    election_lease_s: int | None,
    events_endpoint: str | None,
    events_replay_endpoint: str | None,
    log_json: bool | None,
    log_format: str | None,
    log_level: str | None,
    **tls_flags: str | None,
) -> None:
    """Run the metadata master until SIGTERM/SIGINT (membership, block index, placement).

    With --etcd several masters run; one leads (elected through etcd) and the others answer
    NotLeader naming it. Settings: defaults < --config TOML < KVSTORED_MASTER__* env vars <
    these flags.
    """
    from kvstored.config import load_config
    from kvstored.log import bind_process, configure

    overrides = {"listen": list(listen) or None, "data_dir": data_dir,
                 "node_lease_s": node_lease_s, "placement_policy": placement_policy,
                 "metrics_listen": metrics_listen, "events_endpoint": events_endpoint,
                 "events_replay_endpoint": events_replay_endpoint, "log_json": log_json, "log_format": log_format,
                 "log_level": log_level,
                 "etcd": [e for e in etcd.split(",") if e.strip()] if etcd is not None else None,
                 "election_prefix": election_prefix, "election_lease_s": election_lease_s}
    try:
        loaded = load_config(config_path, overrides={"master": overrides,
                                                      "tls": _tls_overrides(tls_flags)},
                             override_sources={f"tls.{k}": v for k, v in _TLS_FLAGS.items()})
        cfg = loaded.master
        tls = _tls_of(loaded)
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    configure(json=cfg.log_as_json, level=cfg.log_level)
    bind_process(component="master")
    from kvstored.master.daemon import MasterDaemon

    try:
        asyncio.run(MasterDaemon(cfg, tls=tls).run(on_started=_print_master_started))
    except ConfigInvalid as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(2)
    except KvstoredError as exc:
        click.echo(f"kvstored: {exc}", err=True)
        sys.exit(1)


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="TOML config file (its node.arena_dir is the directory cleaned).")
@click.option("--arena-dir", metavar="DIR",
              help="Arena directory (default: node.arena_dir, /dev/shm unless configured).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.argument("paths", nargs=-1, metavar="[ARENA_FILE]...")
def cleanup(config_path: str | None, arena_dir: str | None, dry_run: bool,
            paths: tuple[str, ...]) -> None:
    """Remove arena files that node daemons which died (SIGKILL, OOM) left in the arena dir.

    A daemon reclaims only its own node's stale file at start; other nodes' files are left to
    this command. Prints one line per kvstored arena file: ``removed PATH (...)`` (or ``would
    remove`` with --dry-run), or ``keep PATH (owner pid N is running)``. With ARENA_FILEs,
    only those: one whose owner runs is refused (exit 1).
    """
    from kvstored.config import load_config
    from kvstored.tiers.dram import ArenaInUse, list_arena_files, remove_stale_arena
    from kvstored.units import format_size

    if arena_dir is None:
        try:
            arena_dir = str(load_config(config_path).node.arena_dir)
        except ConfigInvalid as exc:
            click.echo(f"kvstored: {exc}", err=True)
            sys.exit(2)
    if not os.path.isdir(arena_dir):
        click.echo(f"kvstored: the arena dir {arena_dir!r} does not exist or is not a directory "
                   "(set --arena-dir or node.arena_dir)", err=True)
        sys.exit(2)
    found = list_arena_files(arena_dir)
    if paths:
        by_path = {f.path: f for f in found}
        wanted = [os.path.join(arena_dir, p) if os.sep not in p else p for p in paths]
        unknown = [p for p in wanted if p not in by_path]
        if unknown:
            click.echo(f"kvstored: not a kvstored arena file in {arena_dir}: "
                       f"{', '.join(unknown)}", err=True)
            sys.exit(2)
        found = [by_path[p] for p in wanted]
    failed = False
    num_removed = num_bytes = 0
    for f in found:
        what = f"{f.path} (node {f.node_name}, pid {f.pid}, {format_size(f.size_bytes)})"
        if f.owner_running:
            if paths:
                click.echo(f"kvstored: refusing {f.path}: its owner pid {f.pid} is running",
                           err=True)
                failed = True
            else:
                click.echo(f"keep {f.path} (owner pid {f.pid} is running)")
            continue
        if dry_run:
            click.echo(f"would remove {what}")
            continue
        try:
            remove_stale_arena(f)
        except (ArenaInUse, OSError) as exc:
            click.echo(f"kvstored: cannot remove {f.path}: {exc}", err=True)
            failed = True
            continue
        click.echo(f"removed {what}")
        num_removed += 1
        num_bytes += f.size_bytes
    if not dry_run:
        click.echo(f"{num_removed} stale arena file(s) removed, {format_size(num_bytes)} freed")
    sys.exit(1 if failed else 0)


def _add_config_commands() -> None:
    from kvstored.cli.config_cmd import config_group

    main.add_command(config_group)


_add_config_commands()


if __name__ == "__main__":
    main()
