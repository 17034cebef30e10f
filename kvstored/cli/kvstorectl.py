"""``kvstorectl``: the online admin CLI of a kvstored node (uses only kvstored.client).

Global flags: ``--address`` (default ``$KVSTORED_ADDRESS`` or the local unix socket),
``--timeout-s``, ``--output table|json`` (also accepted after the command name). Commands: ``status``,
``stats``, ``blocks``,
``where``, ``nodes`` and ``evict`` (ask a master: ``--address MASTER``) and ``scheduler``
(kvstored/cli/scheduler.py). What the commands share (``ctx.obj``, options, exit codes) is in
kvstored/cli/ctl_common.py.

Node or master: ``where`` and ``blocks`` against a TCP address first probe it (one
``ListNodes`` call a node answers UNIMPLEMENTED): a node (or any unix socket) gets the
single-node behaviour below, unchanged; a master gets the cluster views of
kvstored/cli/cluster.py (every replica of every block; ``blocks --node NODE_ID``).

Exit codes: 0 ok, 1 error, 2 bad arguments (a bad hex key, an unknown node id, a node
command sent to a master, ``replicate`` of a key not stored: the stored ones are set), 3 node or
master unreachable (at once when the unix socket file does not exist or refuses
connections), 4 server error (for ``evict``: a holder node could not be asked).

``--tenant NAME`` (global, or after the command) acts in that tenant's key space
(docs/tenants.md). ``blocks --namespace-id`` takes any unique prefix of a namespace id; ``where`` keeps the order
of its keys as given, positional and ``--keys`` mixed.

JSON output (sorted keys, stable for scripts)::

    status  {"node_id", "version", "epoch", "draining", "uptime_s",
             "addresses": {"grpc": [...], "data", "metrics"},
             "arena": {"path", "size_bytes"},
             "tiers": [{"tier", "used_bytes", "capacity_bytes", "num_blocks", "hits", "evictions"}]}
    stats   the node's counters (see kvstored.client._ops.stats_to_dict); uptime_s in
            seconds (tables show it as "1h 02m 03s")
    blocks  {"blocks": [{"key", "size_bytes", "namespace_id", "tenant", "tiers", "pinned"}],
             "count", "truncated"}                    (keys and ids in hex; namespace_id
             without its tenant, docs/tenants.md)
    where   {"num_blocks", "num_leading_hits", "namespace_id",
             "blocks": [{"index", "key", "tier"}]}    (tier: "DRAM", "SSD" or null)
            (--address MASTER: each block also has "replication_factor" and "replicas")
    nodes   {"master_epoch", "term", "leader", "num_replicas", "departed_since_term",
             "nodes": [{"node_id", "epoch", "grpc_address", "data_address", "zone", "health",
                        "load", "num_replicas", "lease_left_s", "last_seq", "draining",
                        "coldest_age_s",
                        "tiers": [{"tier", "used_bytes", "capacity_bytes", "num_blocks",
                                   "spare_bytes"}]}]}
            (health: "healthy", "unhealthy", "probation" or "syncing"; coldest_age_s:
            seconds since its coldest original block was used, 0 = none: pool LRU;
            spare_bytes: of used_bytes, what the node can free without dropping a block,
            its remote-fill copies and DRAM blocks also on its SSD: placement's room;
            "departed": the nodes that left during this leader's term, departed_since_term:
            that term: a failover or a master restart starts the list empty, the table's
            title says "departed since term T began" / "since this master started")
    drain   {"node_id", "draining", "num_blocks", "num_blocks_to_move", "num_copies_issued",
             "leave_sent", "left"}
    replicate {"num_keys", "replicas", "namespace_id", "num_live_nodes", "short",
             "num_not_stored", "not_stored": [key hex], "complete"}
            (num_keys: keys whose factor was set; not_stored: keys no node holds, given no
            factor, exit 2; while some node still syncs (complete false) an unindexed key
            may be on it: it is set too, with a warning)
    errors  {"error": {"code", "message"}}
"""

from __future__ import annotations

import json
import pathlib
import tomllib
from typing import Any

import click

from kvstored.cli import cluster, output
from kvstored.cli.ctl_common import (
    DEFAULT_WATCH_INTERVAL_S,
    EXIT_BAD_ARGS,
    INTERVAL_HELP,
    WATCH_HELP,
    WATCHABLE,
    CtlContext,
    asks_a_node,
    common_options,
    handle_errors,
    resolve_tls,
    watch_options,
)
from kvstored.cli.main import LazyGroup
from kvstored.errors import DeadlineExceeded, InvalidArgument, Unavailable


@click.group(cls=LazyGroup, lazy_commands={"scheduler": "kvstored.cli.scheduler:scheduler",
                                            "events": "kvstored.cli.events:events"})
@click.option("--address", default=None, metavar="unix:PATH|HOST:PORT",
              help="Node address (default: $KVSTORED_ADDRESS or the local unix socket).")
@click.option("--timeout-s", type=click.FloatRange(min=0.001), default=5.0, show_default=True,
              help="Deadline of each call, seconds.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--watch", is_flag=True, help=WATCH_HELP)
@click.option("--interval-s", type=click.FloatRange(min=0.05), default=DEFAULT_WATCH_INTERVAL_S,
              show_default=True, help=INTERVAL_HELP)
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="With --watch: stop after this many refreshes.")
@click.option("--tenant", default="", metavar="NAME",
              help="Act in this tenant's key space (docs/tenants.md); default: the shared "
                   "tenant, which (as an admin) lists every tenant's blocks.")
@click.option("--tls-cert", metavar="PEM", default=None,
              help="Client certificate for mutual TLS to a HOST:PORT address (with --tls-key, --tls-ca).")
@click.option("--tls-key", metavar="PEM", default=None, help="Private key of --tls-cert.")
@click.option("--tls-ca", metavar="PEM", default=None, help="CA that signed the server's certificate.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TOML file whose [tls] section to use (default: flags, else KVSTORED_TLS__* env).")
@click.pass_context
def main(ctx: click.Context, address: str | None, timeout_s: float, output: str,
         watch: bool, interval_s: float, count: int | None, tenant: str,
         tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
         config_path: str | None) -> None:
    """Inspect a kvstored node (status, stats, blocks, where a prefix lives) or a cluster
    through its master (nodes, where, blocks --node, evict); ``--watch`` keeps status,
    stats and nodes live."""
    if (watch or count is not None) and ctx.invoked_subcommand not in WATCHABLE:
        raise click.UsageError(
            f"--watch/--count apply to {', '.join(WATCHABLE)}, not to {ctx.invoked_subcommand!r}")
    ctx.obj = CtlContext(address=address, timeout_s=timeout_s, output=output, watch=watch,
                         interval_s=interval_s, count=count, tenant=tenant,
                         tls=resolve_tls(tls_cert, tls_key, tls_ca, config_path))


WATCH_ERRORS = (Unavailable, DeadlineExceeded)
"""Errors a ``--watch`` refresh shows and survives (the daemon is restarting or slow)."""


def _tiers(stats: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in stats["tiers"]]


@main.command()
@common_options
@watch_options
@click.pass_obj
@handle_errors
def status(obj: CtlContext) -> None:
    """Node id, epoch, addresses, draining, and tier usage."""
    with asks_a_node(obj, "status"), obj.client() as c:
        output.emit_watched(obj.output, lambda: _status_data(c), _status_tables,
                            watch_s=obj.watch_s(), count=obj.count, errors=WATCH_ERRORS)


def _status_data(c: Any) -> dict[str, Any]:
    info = c.describe()
    stats = c.stats()
    return {
        "node_id": info.node_id,
        "version": info.version,
        "epoch": info.epoch,
        "draining": info.draining,
        "uptime_s": round(stats["uptime_s"], 3),
        "addresses": {
            "grpc": list(info.listen_addresses),
            "data": info.data_address,
            "metrics": info.metrics_address,
        },
        "arena": {"path": info.arena_path, "size_bytes": info.arena_size_bytes},
        "tiers": _tiers(stats),
    }


def _status_tables(d: dict[str, Any]) -> list[Any]:
    rows = [
        ("node", d["node_id"]), ("version", d["version"]), ("epoch", d["epoch"]),
        ("draining", d["draining"]), ("uptime", output.format_duration(d["uptime_s"])),
        *[("grpc", a) for a in d["addresses"]["grpc"]],
        ("data plane", d["addresses"]["data"] or "-"),
        ("metrics", d["addresses"]["metrics"] or "-"),
        ("arena", d["arena"]["path"] or "(anonymous)"),
    ]
    return [output.kv_table("node", rows), output.tier_table(d["tiers"])]


@main.command()
@common_options
@watch_options
@click.pass_obj
@handle_errors
def stats(obj: CtlContext) -> None:
    """Counters (gets, hits, puts, failures, pins) and tier usage."""
    with asks_a_node(obj, "stats"), obj.client() as c:
        output.emit_watched(obj.output, c.stats, _stats_tables, watch_s=obj.watch_s(),
                            count=obj.count, errors=WATCH_ERRORS)


def _stats_tables(d: dict[str, Any]) -> list[Any]:
    keys = ("node_id", "epoch", "draining", "gets", "hits", "misses", "puts",
            "put_failures", "checksum_failures", "pinned_blocks", "quarantined_bytes",
            "num_sessions", "remote_rdma_blocks", "remote_tcp_blocks", "rdma_fallbacks",
            "rdma_device", "rdma_sessions")
    rows = [(k, d.get(k, "")) for k in keys]
    rows.insert(2, ("uptime", output.format_duration(d["uptime_s"])))
    return [output.kv_table("counters", rows), output.tier_table(d["tiers"])]


def _load_namespace_file(path: str) -> Any:
    from kvstored.keys import Namespace

    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InvalidArgument(f"cannot read namespace file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"namespace file {path} is not valid TOML/JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("namespace"), dict):
        data = data["namespace"]
    if not isinstance(data, dict):
        raise InvalidArgument(f"namespace file {path} must hold a table of Namespace fields")
    return Namespace.from_dict(data)


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _parse_hex(value: str, what: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        if value and set(value) <= _HEX_DIGITS:  # hex, but half a byte short
            raise InvalidArgument(
                f"{what} {value!r} has an odd number of hex digits ({len(value)}); each byte "
                "is two"
            ) from None
        raise InvalidArgument(f"{what} {value!r} is not hex") from None


NAMESPACE_ID_HEX_DIGITS = cluster.NAMESPACE_ID_HEX_DIGITS
_RESOLVE_LIMIT = 1_000_000  # the node's MAX_LIST_LIMIT


def resolve_namespace_prefix(client: Any, prefix: str) -> bytes:
    """The namespace id that a hex prefix (as ``blocks`` prints it: 16 digits) names.

    32 or more digits are taken as the id itself. A shorter prefix is matched against the
    namespace ids of the stored blocks.

    Raises:
        InvalidArgument: not hex; no stored block's namespace id starts with it; more than one
            does (each is listed); or the node holds too many blocks to prove it unique.
    """
    text = cluster.namespace_hex_prefix(
        prefix, too_long_hint=" (give all of them or a unique prefix)")
    if len(text) == NAMESPACE_ID_HEX_DIGITS:
        return _parse_hex(text, "--namespace-id")
    blocks, truncated = client.list_blocks(None, _RESOLVE_LIMIT)
    matches = sorted({b.namespace_id.hex() for b in blocks if b.namespace_id.hex().startswith(text)})
    if truncated:
        raise InvalidArgument(
            f"the node holds more than {len(blocks)} blocks, so the prefix {prefix!r} cannot be "
            f"checked for uniqueness; give all {NAMESPACE_ID_HEX_DIGITS} hex digits"
        )
    if not matches:
        raise InvalidArgument(f"no stored block has a namespace id starting with {prefix!r}")
    if len(matches) > 1:
        raise InvalidArgument(
            f"--namespace-id {prefix!r} is ambiguous: it starts {len(matches)} namespace ids "
            f"({', '.join(matches[:8])}{', ...' if len(matches) > 8 else ''}); give more digits"
        )
    return bytes.fromhex(matches[0])


@main.command()
@click.option("--node", "node_id", metavar="NODE_ID",
              help="With --address MASTER: the blocks the master indexes on this node.")
@click.option("--page-token", metavar="HEX",
              help="With --node: continue after a truncated listing (its next_page_token).")
@click.option("--namespace-id", metavar="HEX",
              help="Only blocks of this namespace id: any unique prefix (blocks shows 16 digits).")
@click.option("--namespace-file", type=click.Path(dir_okay=False), metavar="NS.toml",
              help="Only blocks of the namespace in this TOML/JSON file.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@common_options
@click.pass_obj
@handle_errors
def blocks(obj: CtlContext, node_id: str | None, page_token: str | None,
           namespace_id: str | None, namespace_file: str | None, limit: int) -> None:
    """List stored blocks (never pins, never touches recency); --node: from the master."""
    if namespace_id is not None and namespace_file:
        raise InvalidArgument("give --namespace-id or --namespace-file, not both")
    is_master = cluster.is_master_address(obj)
    if is_master or node_id is not None or page_token is not None:
        if not is_master:
            raise InvalidArgument(
                f"blocks --node asks the master: give --address MASTER_HOST:PORT "
                f"(got {obj.address!r}, not a master)")
        if node_id is None:
            raise InvalidArgument(
                f"{obj.address} is a master: give --node NODE_ID (kvstorectl nodes lists them)")
        with cluster.master_client(obj) as m:
            ns = (cluster.resolve_namespace(m, namespace_id) if namespace_id is not None
                  else obj.scoped(_load_namespace_file(namespace_file).id) if namespace_file
                  else None)
        cluster.blocks(obj, node_id, ns, limit, page_token)
        return
    ns_id = b""
    with obj.client() as c:
        if namespace_id is not None:  # "" is an error, not "every namespace"
            ns_id = resolve_namespace_prefix(c, namespace_id)
        elif namespace_file:
            ns_id = _load_namespace_file(namespace_file).id
        found, truncated = c.list_blocks(ns_id or None, limit)
    data = {
        "count": len(found),
        "truncated": truncated,
        "blocks": [
            {
                "key": b.key.hex(), "size_bytes": b.size_bytes,
                "namespace_id": ns.hex(), "tenant": tenant, "tiers": [t.name for t in b.tiers],
                "pinned": b.pinned,
            }
            for b in found
            for tenant, ns in [_tenant_and_namespace(obj, b.namespace_id)]
        ],
    }

    def tables(d: dict[str, Any]) -> list[Any]:
        from kvstored.units import format_size

        rows = [
            (b["key"], format_size(b["size_bytes"]), b["tenant"] or "-",
             b["namespace_id"][:16] or "-", ",".join(b["tiers"]), "yes" if b["pinned"] else "")
            for b in d["blocks"]
        ]
        title = f"blocks ({d['count']}{', truncated' if d['truncated'] else ''})"
        return [output.rows_table(
            title, ["key", "size", "tenant", "namespace", "tiers", "pinned"], rows)]

    output.emit(obj.output, data, tables)


def _tenant_and_namespace(obj: CtlContext, namespace_id: bytes) -> tuple[str, bytes]:
    """``(tenant, namespace id)`` of a listed block: a node answers the shared tenant's admin
    with stored ids (every tenant's blocks), anyone else with its own ids."""
    if obj.tenant:
        return obj.tenant, namespace_id
    from kvstored.tenancy import split_namespace

    try:
        return split_namespace(namespace_id)
    except InvalidArgument:
        return "", namespace_id


class KeysInOrderCommand(click.Command):
    """A command whose positional ``KEY_HEX`` arguments and ``--keys`` values form one list in
    command-line order (click would collect positionals and options apart: ``--keys A B``
    gave ``B A``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, keys_as_positionals(self, args))


def keys_as_positionals(command: click.Command, args: list[str]) -> list[str]:
    """Rewrite ``--keys V`` / ``--keys=V`` as the positional ``V`` where it stands.

    Values of the command's other value-taking options are skipped, so a value that happens
    to read ``--keys`` is left alone; everything after ``--`` is left as it is.
    """
    takes_value = {
        opt
        for p in command.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for opt in (*p.opts, *p.secondary_opts)
    }
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg == "--keys" and i + 1 < len(args):
            out.append(args[i + 1])
            i += 2
        elif arg.startswith("--keys="):
            out.append(arg[len("--keys="):])
            i += 1
        elif arg in takes_value and i + 1 < len(args):
            out += args[i : i + 2]
            i += 2
        else:
            out.append(arg)
            i += 1
    return out


def _read_tokens(path: str) -> list[int]:
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        raise InvalidArgument(f"cannot read token file {path}: {exc.strerror}") from None
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            tokens = json.loads(stripped)
        else:
            tokens = [int(t) for t in stripped.replace(",", " ").split()]
    except ValueError as exc:
        raise InvalidArgument(
            f"token file {path} must hold whitespace-separated ints or a JSON list: {exc}"
        ) from None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InvalidArgument(f"token file {path} must hold a list of integer token ids")
    return tokens


@main.command(cls=KeysInOrderCommand)
@click.argument("keys_args", nargs=-1, metavar="[KEY_HEX]...")
@click.option("--keys", "keys_opt", multiple=True, metavar="HEX[,HEX...]",
              help="Block keys in hex (repeatable, comma or space separated); they join "
                   "the positional keys in command-line order.")
@click.option("--tokens", type=click.Path(dir_okay=False), metavar="FILE",
              help="Token ids (whitespace-separated or a JSON list); needs a namespace.")
@click.option("--namespace-file", type=click.Path(dir_okay=False), metavar="NS.toml",
              help="Namespace (TOML/JSON with Namespace fields).")
@click.option("--model", help="Namespace model_id (instead of --namespace-file).")
@click.option("--namespace-id", "namespace_id_hex", metavar="HEX",
              help="Namespace id of the keys: all 32 hex digits or any unique prefix (`blocks` "
                   "prints 16); blocks are namespace-scoped.")
@click.option("--revision", default="main", show_default=True)
@click.option("--kv-dtype", default="bfloat16", show_default=True)
@click.option("--kv-layout", default="layers,kv,heads,tokens,dim", show_default=True)
@click.option("--block-size", type=int, default=256, show_default=True, help="Tokens per block.")
@click.option("--tp-size", type=int, default=1, show_default=True)
@click.option("--tp-rank", type=int, default=0, show_default=True)
@click.option("--tenant-salt", default="", show_default=False)
@common_options
@click.pass_obj
@handle_errors
def where(
    obj: CtlContext,
    keys_args: tuple[str, ...],
    keys_opt: tuple[str, ...],
    tokens: str | None,
    namespace_file: str | None,
    model: str | None,
    namespace_id_hex: str | None,
    revision: str,
    kv_dtype: str,
    kv_layout: str,
    block_size: int,
    tp_size: int,
    tp_rank: int,
    tenant_salt: str,
) -> None:
    """Which tier holds each block of a prefix (given as keys, or as tokens + namespace);
    against a master: every replica of every block, across the cluster."""
    from kvstored.client._args import check_keys
    from kvstored.keys import Namespace, block_hashes

    hex_keys = [k for raw in (*keys_args, *keys_opt) for k in raw.replace(",", " ").split()]
    namespace = None
    if namespace_file and model:
        raise InvalidArgument("give --namespace-file or --model, not both")
    if namespace_file:
        namespace = _load_namespace_file(namespace_file)
    elif model:
        namespace = Namespace(
            model_id=model, revision=revision, kv_dtype=kv_dtype, kv_layout=kv_layout,
            block_size=block_size, tp_size=tp_size, tp_rank=tp_rank, tenant_salt=tenant_salt,
        )
    if tokens and hex_keys:
        raise InvalidArgument("give block keys or --tokens, not both")
    if namespace_id_hex is not None and namespace is not None:
        raise InvalidArgument("give --namespace-id or --namespace-file/--model, not several")
    if tokens:
        if namespace is None:
            raise InvalidArgument("--tokens needs a namespace: --namespace-file or --model")
        keys = block_hashes(namespace, _read_tokens(tokens))
        if not keys:
            raise InvalidArgument(
                f"the token file holds fewer tokens than one block ({namespace.block_size})"
            )
    elif hex_keys:
        keys = [_parse_hex(k, "key") for k in hex_keys]
    else:
        raise InvalidArgument("give block keys (KEY_HEX... or --keys) or --tokens FILE")
    if cluster.is_master_address(obj):
        cluster.where(obj, keys, namespace.id if namespace is not None else None,
                      namespace_id_hex)
        return
    ns_override = None
    with obj.client(namespace) as c:
        check_keys(keys, c.describe())  # the node's own key bounds, the client's message
        if namespace_id_hex is not None:  # any unique prefix, as `blocks` takes it
            ns_override = resolve_namespace_prefix(c, namespace_id_hex)
        tiers = c.where(keys, namespace_id=ns_override)
    leading = 0
    while leading < len(tiers) and tiers[leading] is not None:
        leading += 1
    data = {
        "num_blocks": len(keys),
        "num_leading_hits": leading,
        "namespace_id": namespace.id_hex if namespace is not None else (ns_override or b"").hex(),
        "blocks": [
            {"index": i, "key": k.hex(), "tier": t.name if t is not None else None}
            for i, (k, t) in enumerate(zip(keys, tiers, strict=True))
        ],
    }

    def tables(d: dict[str, Any]) -> list[Any]:
        rows = [(b["index"], b["key"], b["tier"] or "missing") for b in d["blocks"]]
        title = f"prefix of {d['num_blocks']} blocks: {d['num_leading_hits']} leading blocks present"
        return [output.rows_table(title, ["#", "key", "tier"], rows)]

    output.emit(obj.output, data, tables)


@main.command()
@common_options
@watch_options
@click.pass_obj
@handle_errors
def nodes(obj: CtlContext) -> None:
    """Cluster membership from the master (--address MASTER): epoch, health, usage, load."""
    from kvstored.client.master import MasterClient

    address = cluster.require_master(obj, "nodes")
    with MasterClient(address, timeout_s=obj.timeout_s, tls=obj.tls) as m:
        def produce() -> dict[str, Any]:
            d: dict[str, Any] = m.list_nodes()
            # departures are kept by the leader of this term only (a new leader or a
            # restarted master knows none from before): say since when
            d["departed_since_term"] = d.get("term", 0)
            return d

        output.emit_watched(obj.output, produce, _nodes_tables, watch_s=obj.watch_s(),
                            count=obj.count, min_width=160, errors=WATCH_ERRORS)


def _nodes_tables(d: dict[str, Any]) -> list[Any]:
    from kvstored.units import format_size

    def usage(n: dict[str, Any], tier: str) -> str:
        t = next((t for t in n["tiers"] if t["tier"] == tier), None)
        if t is None or not t["capacity_bytes"]:
            return "-"
        return f"{format_size(t['used_bytes'])} / {format_size(t['capacity_bytes'])}"

    rows = [
        (n["node_id"], n["grpc_address"], n.get("zone") or "-", n["epoch"],
         n["health"] + (", draining" if n.get("draining") else ""),
         usage(n, "DRAM"), usage(n, "SSD"), f"{n['load']:g}", n["num_replicas"],
         f"{n['coldest_age_s']:.1f} s" if n.get("coldest_age_s") else "-",
         f"{n['lease_left_s']:.1f} s")
        for n in d["nodes"]
    ]
    rows += [  # nodes that left: shown as such, never silently dropped from the view
        (n["node_id"], n["grpc_address"], "-", n["epoch"], n["reason"], "-", "-", "-",
         f"0 (had {n['num_replicas']})", "-", f"gone {n['departed_s_ago']:.1f} s ago")
        for n in d.get("departed", [])
    ]
    # a leader's membership (departed nodes too) is its own term's: a failover or a restart
    # starts it empty, so the departed count says since when it is kept
    ha = bool(d.get("term")) and d.get("term") != d["master_epoch"]
    since = f"since term {d['term']} began" if ha else "since this master started"
    title = (f"nodes ({len(d['nodes'])} live, {len(d.get('departed', []))} departed {since}; "
             f"master epoch {d['master_epoch']}, {d['num_replicas']} replicas"
             + (f"; leader {d['leader']} term {d['term']}" if d.get("term") != d["master_epoch"]
                else "") + ")")
    cols = ["node", "address", "zone", "epoch", "health", "DRAM used/cap", "SSD used/cap",
            "load", "replicas", "coldest", "lease left"]
    return [output.rows_table(title, cols, rows)]


@main.command()
@click.argument("node_id")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the node has left (every block re-homed), up to --wait-s.")
@click.option("--wait-s", type=float, default=300.0, show_default=True,
              help="Most seconds to wait for the node to leave.")
@common_options
@click.pass_obj
@handle_errors
def drain(obj: CtlContext, node_id: str, wait: bool, wait_s: float) -> None:
    """Drain NODE_ID through the master (--address MASTER): nothing new is placed there,
    every block it holds with no other replica is copied to other nodes, then the node
    unregisters. Reads keep being served by it until then."""
    import time

    from kvstored.client.master import MasterClient
    from kvstored.errors import NotFound

    address = cluster.require_master(obj, "drain")
    with MasterClient(address, timeout_s=obj.timeout_s, tls=obj.tls) as m:
        try:
            data: dict[str, Any] = {**m.drain_node(node_id), "left": False}
        except NotFound as exc:  # an unknown node id is a bad argument (exit 2), as documented
            raise InvalidArgument(str(exc)) from None
        deadline = time.monotonic() + wait_s
        while wait and time.monotonic() < deadline:
            try:
                data = {**m.drain_node(node_id), "left": False}
            except NotFound:  # unregistered: the drain is done
                data.update(left=True, num_blocks_to_move=0, leave_sent=True)
                break
            time.sleep(0.5)

    def tables(d: dict[str, Any]) -> list[Any]:
        state = "left" if d["left"] else ("leaving" if d["leave_sent"] else "draining")
        rows = [(d["node_id"], state, d["num_blocks"], d["num_blocks_to_move"],
                 d["num_copies_issued"])]
        return [output.rows_table(f"drain of {d['node_id']}", [
            "node", "state", "blocks", "to move", "copies issued"], rows)]

    output.emit(obj.output, data, tables)


@main.command(cls=KeysInOrderCommand)
@click.argument("keys_args", nargs=-1, metavar="[KEY_HEX]...")
@click.option("--replicas", type=click.IntRange(1, 8), required=True,  # 8: MAX_REPLICAS
              help="Wanted replicas of each block (1..8; 1 = no repair).")
@click.option("--namespace-id", "namespace_id_hex", metavar="HEX", default=None,
              help="Namespace id of the keys: all 32 hex digits or a unique prefix (default: "
                   "the empty namespace of a client given none).")
@common_options
@click.pass_obj
@handle_errors
def replicate(obj: CtlContext, keys_args: tuple[str, ...], replicas: int,
              namespace_id_hex: str | None) -> None:
    """Set the replication factor of stored blocks through the master (--address MASTER):
    its repair copies each to distinct nodes until it has --replicas, and again after a
    holder leaves. Keys the cluster does not store are named and left alone (exit 2)."""
    import sys

    from kvstored.client.master_admin import MasterAdminClient

    hex_keys = [k for raw in keys_args for k in raw.replace(",", " ").split()]
    if not hex_keys:
        raise InvalidArgument("give block keys (KEY_HEX...)")
    keys = [_parse_hex(k, "key") for k in hex_keys]
    cluster.check_key_lengths(keys)
    address = cluster.require_master(obj, "replicate")
    m = MasterAdminClient(address, timeout_s=obj.timeout_s, tls=obj.tls)
    with m:  # (``as`` would type it as the base MasterClient)
        ns = b"" if namespace_id_hex is None else cluster.resolve_namespace(m, namespace_id_hex)
        per_key, _, complete = m.list_replicas_and_factors(ns, keys)
        # a key no node holds gets no factor: README "for blocks already stored" (the
        # master's admin factors live in its memory only, and a put sets its own); while a
        # node is still syncing its inventory an unindexed key may be on it: set it too
        stored = [k for k, reps in zip(keys, per_key, strict=True) if reps or not complete]
        not_stored = [k for k, reps in zip(keys, per_key, strict=True) if not reps]
        n = m.set_replication(ns, stored, replicas) if stored else 0
        nodes: list[dict[str, Any]] = m.list_nodes()["nodes"]  # type: ignore[assignment]  # list_nodes' stable dict
    num_live = sum(1 for nd in nodes if not nd["draining"])
    data: dict[str, Any] = {
        "num_keys": n, "replicas": replicas, "namespace_id": ns.hex(),
        "num_live_nodes": num_live, "short": replicas > num_live,
        "num_not_stored": len(not_stored), "not_stored": [k.hex() for k in not_stored],
        "complete": complete}
    if replicas > num_live:
        click.echo(f"kvstorectl: warning: --replicas {replicas} is more than the {num_live} live "
                   f"node(s): repair places at most {num_live} replica(s) of each block until more "
                   "nodes join", err=True)

    def tables(d: dict[str, Any]) -> list[Any]:
        return [output.rows_table("replication", ["keys set", "replicas", "live nodes",
                                                  "not stored", "namespace"],
                                  [(d["num_keys"], d["replicas"], d["num_live_nodes"],
                                    d["num_not_stored"], d["namespace_id"] or "-")])]

    output.emit(obj.output, data, tables)
    if not_stored:
        shown = ", ".join(k.hex() for k in not_stored[:8]) + (", ..." if len(not_stored) > 8 else "")
        if complete:
            sys.stderr.write(
                f"kvstorectl: NOT_FOUND: {len(not_stored)} of {len(keys)} key(s) are not stored "
                f"in the cluster (namespace {ns.hex() or 'empty'}), so no factor was set for "
                f"them: {shown}; the factor was set for the {n} stored key(s)\n")
            click.get_current_context().exit(EXIT_BAD_ARGS)
        sys.stderr.write(
            f"kvstorectl: warning: {len(not_stored)} key(s) are not indexed, but some nodes are "
            f"still syncing their inventory, so the factor was set for them too: {shown}\n")


main.add_command(cluster.evict_command(keys_command_cls=KeysInOrderCommand,
                                       common_options=common_options,
                                       handle_errors=handle_errors, parse_hex=_parse_hex))

if __name__ == "__main__":
    main()
