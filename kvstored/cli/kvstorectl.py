"""``kvstorectl``: the online admin CLI of a kvstored node (uses only kvstored.client).

Global flags: ``--address`` (default ``$KVSTORED_ADDRESS`` or the local unix socket),
``--timeout-s``, ``--output table|json`` (also accepted after the command name). Commands: ``status``, ``stats``, ``blocks``,
``where`` (and ``scheduler`` when kvstored.scheduler is installed).

Exit codes: 0 ok, 1 error, 2 bad arguments, 3 node unreachable, 4 server error.

JSON output (sorted keys, stable for scripts)::

    status  {"node_id", "version", "epoch", "draining", "uptime_s",
             "addresses": {"grpc": [...], "data", "metrics"},
             "arena": {"path", "size_bytes"},
             "tiers": [{"tier", "used_bytes", "capacity_bytes", "num_blocks", "hits", "evictions"}]}
    stats   the node's counters (see kvstored.client._ops.stats_to_dict)
    blocks  {"blocks": [{"key", "size_bytes", "namespace_id", "tiers", "pinned"}],
             "count", "truncated"}                    (keys and ids in hex)
    where   {"num_blocks", "num_leading_hits", "namespace_id",
             "blocks": [{"index", "key", "tier"}]}    (tier: "DRAM", "SSD" or null)
    errors  {"error": {"code", "message"}}
"""

from __future__ import annotations

import functools
import json
import pathlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from kvstored.cli import output
from kvstored.cli.main import LazyGroup
from kvstored.errors import DeadlineExceeded, InvalidArgument, KvstoredError, Unavailable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_ARGS = 2
EXIT_UNREACHABLE = 3
EXIT_SERVER_ERROR = 4

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CtlContext:
    """What every kvstorectl command receives as ``ctx.obj``."""

    address: str | None
    timeout_s: float
    output: str

    def client(self, namespace: Any = None) -> Any:
        """A client for admin calls (gRPC only: admin calls never move bulk bytes)."""
        from kvstored.client import Client

        return Client(self.address, timeout_s=self.timeout_s, namespace=namespace, transport="grpc")


def _override(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None and isinstance(ctx.obj, CtlContext):
        setattr(ctx.obj, param.name or "", value)
    return value


def _common_options(fn: F) -> F:
    """``--address``, ``--timeout-s`` and ``--output`` also after the command name."""
    for decorator in (
        click.option("--output", type=click.Choice(["table", "json"]), default=None,
                     expose_value=False, callback=_override, is_eager=True,
                     help="Same as the global --output."),
        click.option("--timeout-s", type=click.FloatRange(min=0.001), default=None,
                     expose_value=False, callback=_override, is_eager=True,
                     help="Same as the global --timeout-s."),
        click.option("--address", default=None, expose_value=False, callback=_override,
                     is_eager=True, help="Same as the global --address."),
    ):
        fn = decorator(fn)
    return fn


def _handle_errors(fn: F) -> F:
    """Map failures to exit codes and print them (JSON in json mode)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        out = ctx.obj.output if isinstance(ctx.obj, CtlContext) else "table"
        try:
            return fn(*args, **kwargs)
        except (Unavailable, DeadlineExceeded) as exc:
            output.emit_error(out, exc.code.name, str(exc))
            ctx.exit(EXIT_UNREACHABLE)
        except InvalidArgument as exc:
            output.emit_error(out, exc.code.name, str(exc))
            ctx.exit(EXIT_BAD_ARGS)
        except KvstoredError as exc:
            output.emit_error(out, exc.code.name, str(exc))
            ctx.exit(EXIT_SERVER_ERROR)
        except (click.exceptions.Exit, click.ClickException):
            raise
        except Exception as exc:  # a bug or an OS error: report, exit 1
            output.emit_error(out, type(exc).__name__, str(exc))
            ctx.exit(EXIT_ERROR)

    return wrapper  # type: ignore[return-value]


@click.group(cls=LazyGroup, lazy_commands={"scheduler": "kvstored.scheduler.ctl:scheduler"})
@click.option("--address", default=None, metavar="unix:PATH|HOST:PORT",
              help="Node address (default: $KVSTORED_ADDRESS or the local unix socket).")
@click.option("--timeout-s", type=click.FloatRange(min=0.001), default=5.0, show_default=True,
              help="Deadline of each call, seconds.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def main(ctx: click.Context, address: str | None, timeout_s: float, output: str) -> None:
    """Inspect a kvstored node: status, stats, blocks, where a prefix lives."""
    ctx.obj = CtlContext(address=address, timeout_s=timeout_s, output=output)


def _tiers(stats: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in stats["tiers"]]


@main.command()
@_common_options
@click.pass_obj
@_handle_errors
def status(obj: CtlContext) -> None:
    """Node id, epoch, addresses, draining, and tier usage."""
    with obj.client() as c:
        info = c.describe()
        stats = c.stats()
    data = {
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

    def tables(d: dict[str, Any]) -> list[Any]:
        rows = [
            ("node", d["node_id"]), ("version", d["version"]), ("epoch", d["epoch"]),
            ("draining", d["draining"]), ("uptime", f"{d['uptime_s']:.1f} s"),
            *[("grpc", a) for a in d["addresses"]["grpc"]],
            ("data plane", d["addresses"]["data"] or "-"),
            ("metrics", d["addresses"]["metrics"] or "-"),
            ("arena", d["arena"]["path"] or "(anonymous)"),
        ]
        return [output.kv_table("node", rows), output.tier_table(d["tiers"])]

    output.emit(obj.output, data, tables)


@main.command()
@_common_options
@click.pass_obj
@_handle_errors
def stats(obj: CtlContext) -> None:
    """Counters (gets, hits, puts, failures, pins) and tier usage."""
    with obj.client() as c:
        data = c.stats()

    def tables(d: dict[str, Any]) -> list[Any]:
        keys = ("node_id", "epoch", "uptime_s", "draining", "gets", "hits", "misses", "puts",
                "put_failures", "checksum_failures", "pinned_blocks", "quarantined_bytes",
                "num_sessions")
        return [output.kv_table("counters", [(k, d[k]) for k in keys]), output.tier_table(d["tiers"])]

    output.emit(obj.output, data, tables)


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


def _parse_hex(value: str, what: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise InvalidArgument(f"{what} {value!r} is not hex") from None


@main.command()
@click.option("--namespace-id", metavar="HEX", help="Only blocks of this namespace id.")
@click.option("--namespace-file", type=click.Path(dir_okay=False), metavar="NS.toml",
              help="Only blocks of the namespace in this TOML/JSON file.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@_common_options
@click.pass_obj
@_handle_errors
def blocks(obj: CtlContext, namespace_id: str | None, namespace_file: str | None, limit: int) -> None:
    """List stored blocks (never pins, never touches recency)."""
    if namespace_id and namespace_file:
        raise InvalidArgument("give --namespace-id or --namespace-file, not both")
    ns_id = b""
    if namespace_id:
        ns_id = _parse_hex(namespace_id, "--namespace-id")
    elif namespace_file:
        ns_id = _load_namespace_file(namespace_file).id
    with obj.client() as c:
        found, truncated = c.list_blocks(ns_id or None, limit)
    data = {
        "count": len(found),
        "truncated": truncated,
        "blocks": [
            {
                "key": b.key.hex(), "size_bytes": b.size_bytes,
                "namespace_id": b.namespace_id.hex(), "tiers": [t.name for t in b.tiers],
                "pinned": b.pinned,
            }
            for b in found
        ],
    }

    def tables(d: dict[str, Any]) -> list[Any]:
        from kvstored.units import format_size

        rows = [
            (b["key"], format_size(b["size_bytes"]), b["namespace_id"][:16] or "-",
             ",".join(b["tiers"]), "yes" if b["pinned"] else "")
            for b in d["blocks"]
        ]
        title = f"blocks ({d['count']}{', truncated' if d['truncated'] else ''})"
        return [output.rows_table(title, ["key", "size", "namespace", "tiers", "pinned"], rows)]

    output.emit(obj.output, data, tables)


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


@main.command()
@click.argument("keys_args", nargs=-1, metavar="[KEY_HEX]...")
@click.option("--keys", "keys_opt", multiple=True, metavar="HEX[,HEX...]",
              help="Block keys in hex (repeatable, comma or space separated).")
@click.option("--tokens", type=click.Path(dir_okay=False), metavar="FILE",
              help="Token ids (whitespace-separated or a JSON list); needs a namespace.")
@click.option("--namespace-file", type=click.Path(dir_okay=False), metavar="NS.toml",
              help="Namespace (TOML/JSON with Namespace fields).")
@click.option("--model", help="Namespace model_id (instead of --namespace-file).")
@click.option("--revision", default="main", show_default=True)
@click.option("--kv-dtype", default="bfloat16", show_default=True)
@click.option("--kv-layout", default="layers,kv,heads,tokens,dim", show_default=True)
@click.option("--block-size", type=int, default=256, show_default=True, help="Tokens per block.")
@click.option("--tp-size", type=int, default=1, show_default=True)
@click.option("--tp-rank", type=int, default=0, show_default=True)
@click.option("--tenant-salt", default="", show_default=False)
@_common_options
@click.pass_obj
@_handle_errors
def where(
    obj: CtlContext,
    keys_args: tuple[str, ...],
    keys_opt: tuple[str, ...],
    tokens: str | None,
    namespace_file: str | None,
    model: str | None,
    revision: str,
    kv_dtype: str,
    kv_layout: str,
    block_size: int,
    tp_size: int,
    tp_rank: int,
    tenant_salt: str,
) -> None:
    """Which tier holds each block of a prefix (given as keys, or as tokens + namespace)."""
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
    with obj.client(namespace) as c:
        tiers = c.where(keys)
    leading = 0
    while leading < len(tiers) and tiers[leading] is not None:
        leading += 1
    data = {
        "num_blocks": len(keys),
        "num_leading_hits": leading,
        "namespace_id": namespace.id_hex if namespace is not None else "",
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


if __name__ == "__main__":
    main()
