"""kvstorectl's cluster views: ``where``, ``blocks --node`` and ``evict`` against a master.

``kvstorectl --address ADDR where|blocks`` asks ADDR what it is first (one ``ListNodes``
probe; a node answers UNIMPLEMENTED): a unix socket or a node keeps the single-node
behaviour of kvstorectl.py exactly; a master gets the cluster view from here. ``evict``
always needs a master (it resolves holders there, then calls each holder's ``Remove``).

JSON output (sorted keys)::

    where   {"num_blocks", "num_leading_present", "namespace_id", "complete",
             "blocks": [{"index", "key", "present", "in_prefix",
                         "num_replicas", "num_copies",
                         "replicas": [{"node_id", "epoch", "tier", "size_bytes",
                                       "generation", "state", "readable", "copy"}]}]}
            (present: some replica is readable; in_prefix: index < num_leading_present,
            i.e. before the first block missing cluster-wide; copy: a remote-fill copy of
            another node's block, which its holder evicts first; the tables of both views
            mark it "copy": "committed copy"; "replicas" has one entry per node and tier, a
            block in a node's DRAM and on its SSD two; num_replicas counts the nodes with a
            readable original, num_copies the others with a readable copy; the table shows
            one row per node, tiers joined: "DRAM+SSD")
    blocks  {"node_id", "epoch", "num_replicas", "count", "truncated", "next_page_token",
             "blocks": [{"namespace_id", "tenant", "key", "tier", "size_bytes", "generation",
                         "state", "copy"}]}
            (namespace_id: the stored id the master indexes, tenant: its tenant)
    evict   {"num_removed", "num_kept", "num_not_indexed", "not_indexed": [key hex],
             "nodes": [{"node_id", "grpc_address", "num_requested", "removed", "kept",
                        "error"}]}

Exit codes as kvstorectl's: 2 for a bad key, an unknown node id or a bad page token; 3 when
the master does not answer; 4 when a holder node could not be asked (the others still are;
the JSON says which).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from kvstored.addresses import is_unix_address
from kvstored.cli import output
from kvstored.cli.ctl_common import EXIT_SERVER_ERROR
from kvstored.errors import InvalidArgument, KeyInvalid, NotFound
from kvstored.tenancy import tenant_of

NAMESPACE_ID_HEX_DIGITS = 32
_SCAN_LIMIT = 1_000_000
EXIT_HOLDER_FAILED = EXIT_SERVER_ERROR


def check_key_lengths(keys: list[bytes], min_key_bytes: int = 16, max_key_bytes: int = 64
                      ) -> None:
    """Refuse, before asking a master, keys its nodes would refuse.

    The bounds are the nodes' defaults (``node.min_key_bytes`` 16, ``node.max_key_bytes``
    64): a master does not know its nodes' settings; a node's own are checked by the client
    (kvstored/client/_args.py, whose message names the node). This message names the key
    rule and the master, never "the node": the address given is a master's.

    Raises:
        KeyInvalid: naming the first bad key's index and its length, e.g. ``key #0 is 1
            bytes; a master takes block keys of 16..64 bytes (32..128 hex digits)``.
    """
    rule = (f"a master takes block keys of {min_key_bytes}..{max_key_bytes} bytes "
            f"({2 * min_key_bytes}..{2 * max_key_bytes} hex digits)")
    for i, k in enumerate(keys):
        if not k:
            raise KeyInvalid(f"key #{i} is empty; {rule}")
        if not min_key_bytes <= len(k) <= max_key_bytes:
            raise KeyInvalid(f"key #{i} is {len(k)} bytes; {rule}")


def master_client(obj: Any) -> Any:
    """A MasterAdminClient for ``obj.address``.

    Raises:
        InvalidArgument: the address is a unix socket (masters listen on TCP only) or unset.
    """
    from kvstored.client.master_admin import MasterAdminClient

    if not obj.address or is_unix_address(obj.address):
        raise InvalidArgument(
            f"this asks the master: give --address MASTER_HOST:PORT (got {obj.address!r})"
        )
    return MasterAdminClient(obj.address, timeout_s=obj.timeout_s, tls=obj.tls)


def require_master(obj: Any, command: str) -> str:
    """Refuse, in one message, an address that is not a master's, for a master-only command.

    Args:
        obj: kvstorectl's context (``address``, ``timeout_s``).
        command: the command's name, for the message (``"nodes"``).

    Returns:
        The master's address (``HOST:PORT``).

    Raises:
        InvalidArgument: the address is unset, a unix socket, or answers gRPC without the
            master's service (a node); the message names the command, the address and the flag.
        Unavailable: nothing answers at the TCP address within ``--timeout-s``.
    """
    fix = "give --address MASTER_HOST:PORT"
    if not obj.address or is_unix_address(obj.address):
        raise InvalidArgument(f"{command} asks the master: {fix} (got {obj.address!r})")
    if not is_master_address(obj):
        raise InvalidArgument(
            f"{command} asks the master: {obj.address} is not a master (a node?); {fix}")
    return str(obj.address)


def state_label(state: str, *, readable: bool = True, copy: bool = False) -> str:
    """How the tables of ``where`` and ``blocks --node`` name a replica's state.

    Args:
        state: ``"writing"`` or ``"committed"``.
        readable: lookups may return it (``where`` knows; ``blocks`` lists only what is indexed).
        copy: a remote-fill copy of another node's block.

    Returns:
        e.g. ``"committed"``, ``"committed copy"``, ``"writing (not readable)"``.
    """
    label = state if readable else f"{state} (not readable)"
    return label + " copy" if copy else label


def is_master_address(obj: Any) -> bool:
    """Whether ``--address`` names a master (False for a unix socket or a node).

    Raises:
        Unavailable: nothing answers at the TCP address within ``--timeout-s``.
    """
    if not obj.address or is_unix_address(obj.address):
        return False
    with master_client(obj) as m:
        return bool(m.is_master())


def _live_node_ids(m: Any) -> list[str]:
    return [n["node_id"] for n in m.list_nodes()["nodes"]]


def _check_node(m: Any, node_id: str) -> None:
    live = _live_node_ids(m)
    if node_id not in live:
        raise InvalidArgument(
            f"unknown node id {node_id!r}: the live nodes are {', '.join(live) or 'none'} "
            "(see kvstorectl nodes)"
        )


def namespace_hex_prefix(prefix: str, *, too_long_hint: str = "") -> str:
    """``--namespace-id``'s value, stripped and lower-cased: hex digits, at most a whole id.

    Args:
        prefix: as the user typed it.
        too_long_hint: appended to the error of a value longer than an id.

    Raises:
        InvalidArgument: empty, not hex, or longer than ``NAMESPACE_ID_HEX_DIGITS``.
    """
    text = prefix.strip().lower()
    if not text or any(ch not in "0123456789abcdef" for ch in text):
        raise InvalidArgument(f"--namespace-id {prefix!r} is not hex")
    if len(text) > NAMESPACE_ID_HEX_DIGITS:
        raise InvalidArgument(
            f"--namespace-id {prefix!r} has {len(text)} hex digits; a namespace id has "
            f"{NAMESPACE_ID_HEX_DIGITS}{too_long_hint}"
        )
    return text


def resolve_namespace(m: Any, prefix: str) -> bytes:
    """The namespace id a hex prefix names, among the blocks the master indexes.

    Raises:
        InvalidArgument: not hex, too long, no match, ambiguous, or too many blocks to check.
    """
    text = namespace_hex_prefix(prefix)
    if len(text) == NAMESPACE_ID_HEX_DIGITS:
        return bytes.fromhex(text)
    seen: set[str] = set()
    scanned = 0
    for node_id in _live_node_ids(m):
        for b in m.iter_node_blocks(node_id):
            scanned += 1
            if scanned > _SCAN_LIMIT:
                raise InvalidArgument(
                    f"the cluster indexes more than {_SCAN_LIMIT} replicas, so the prefix "
                    f"{prefix!r} cannot be checked for uniqueness; give all 32 hex digits"
                )
            if b["namespace_id"].startswith(text):
                seen.add(b["namespace_id"])
    if not seen:
        raise InvalidArgument(f"no indexed block has a namespace id starting with {prefix!r}")
    if len(seen) > 1:
        raise InvalidArgument(
            f"--namespace-id {prefix!r} is ambiguous: it starts {len(seen)} namespace ids "
            f"({', '.join(sorted(seen)[:8])}); give more digits"
        )
    return bytes.fromhex(seen.pop())


_TIER_ORDER = {"DRAM": 0, "SSD": 1}


def replica_counts(replicas: list[dict[str, Any]]) -> dict[str, int]:
    """How many nodes hold a block, as ``where`` counts them.

    Args:
        replicas: the master's rows of one block (``node_id``, ``readable``, ``copy``); a
            node that holds it in DRAM and on its SSD has two rows.

    Returns:
        ``{"num_replicas": nodes with a readable original, "num_copies": other nodes with a
        readable remote-fill copy}``: each node counts once, whatever its tiers.
    """
    originals = {r["node_id"] for r in replicas if r["readable"] and not r["copy"]}
    copies = {r["node_id"] for r in replicas if r["readable"] and r["copy"]} - originals
    return {"num_replicas": len(originals), "num_copies": len(copies)}


def per_node_rows(replicas: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """One ``(node_id, tiers, state)`` row per holder node, in the order the nodes first appear.

    A node's tiers are joined DRAM first (``"DRAM+SSD"``); its state is :func:`state_label`'s
    when every tier has the same one, else each tier's (``"DRAM committed, SSD writing (not
    readable)"``).
    """
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in replicas:
        by_node.setdefault(r["node_id"], []).append(r)
    rows = []
    for node_id, reps in by_node.items():
        reps = sorted(reps, key=lambda r: _TIER_ORDER.get(r["tier"], 9))
        labels = [state_label(r["state"], readable=r["readable"], copy=r["copy"]) for r in reps]
        state = (labels[0] if len(set(labels)) == 1
                 else ", ".join(f"{r['tier']} {lab}" for r, lab in zip(reps, labels, strict=True)))
        rows.append((node_id, "+".join(r["tier"] for r in reps), state))
    return rows


def where(obj: Any, keys: list[bytes], namespace_id: bytes | None, namespace_hex: str | None
          ) -> None:
    """Print every replica of each block of a prefix, marking the first cluster-wide miss."""
    with master_client(obj) as m:
        # a hex prefix names a stored id the master indexes; a namespace (file, model, or
        # none) is scoped by --tenant, as a node scopes its clients' (docs/tenants.md)
        ns = (resolve_namespace(m, namespace_hex) if namespace_hex is not None
              else obj.scoped(namespace_id or b""))
        check_key_lengths(keys)
        per_key, factors, complete = m.list_replicas_and_factors(ns, keys)
    leading = 0
    while leading < len(per_key) and any(r["readable"] for r in per_key[leading]):
        leading += 1
    keep = ("node_id", "epoch", "tier", "size_bytes", "generation", "state", "readable", "copy")
    data = {
        "num_blocks": len(keys), "num_leading_present": leading, "namespace_id": ns.hex(),
        "complete": complete,
        "blocks": [
            {"index": i, "key": k.hex(), "present": any(r["readable"] for r in reps),
             "in_prefix": i < leading, "replication_factor": factor,
             "replicas": [{f: r[f] for f in keep} for r in reps],
             **replica_counts(reps)}
            for i, (k, reps, factor) in enumerate(zip(keys, per_key, factors, strict=True))
        ],
    }

    def tables(d: dict[str, Any]) -> list[Any]:
        rows: list[tuple[Any, ...]] = []
        for b in d["blocks"]:
            mark = "" if b["in_prefix"] else ("first miss" if b["index"] == leading
                                              else "after the miss")
            if not b["replicas"]:
                rows.append((b["index"], b["key"], "-", "missing", "-", "-", mark))
            # replicas count nodes (a block in a node's DRAM and on its SSD is one), and
            # read copies (remote-fill copies) are not replicas: "2/2 +1 copy", never "3/2"
            readable, copies = b["num_replicas"], b["num_copies"]
            wanted = f"{readable}/{b['replication_factor']}" if b["replication_factor"] else "-"
            if copies and b["replication_factor"]:
                wanted += f" +{copies} cop{'y' if copies == 1 else 'ies'}"
            for node_id, tiers, state in per_node_rows(b["replicas"]):
                rows.append((b["index"], b["key"], node_id, tiers, state, wanted, mark))
        title = (f"prefix of {d['num_blocks']} blocks: {d['num_leading_present']} leading "
                 f"blocks present cluster-wide"
                 + ("" if d["complete"] else " (some nodes still syncing)"))
        return [output.rows_table(title, ["#", "key", "node", "tier", "state", "replicas",
                                          "prefix"], rows)]

    output.emit(obj.output, data, tables, min_width=140)


def blocks(obj: Any, node_id: str, namespace_id: bytes | None, limit: int,
           page_token: str | None) -> None:
    """Print the replicas the master indexes on one node (pages of up to 10000)."""
    try:
        token = bytes.fromhex(page_token) if page_token else b""
    except ValueError:
        raise InvalidArgument(f"--page-token {page_token!r} is not hex") from None
    found: list[dict[str, Any]] = []
    info: dict[str, Any] = {}
    with master_client(obj) as m:
        _check_node(m, node_id)
        while len(found) < limit:
            try:
                page = m.list_node_blocks(node_id, namespace_id=namespace_id,
                                          limit=min(10000, limit - len(found)), page_token=token)
            except NotFound as exc:  # left between the check and the call
                raise InvalidArgument(str(exc)) from None
            info = page
            found += page["blocks"]
            token = bytes.fromhex(page["next_page_token"])
            if not token:
                break
    data = {"node_id": node_id, "epoch": info.get("epoch", 0),
            "num_replicas": info.get("num_replicas", 0), "count": len(found),
            "truncated": bool(token), "next_page_token": token.hex(), "blocks": found}
    for b in found:  # the master indexes stored ids: name each block's tenant
        b["tenant"] = tenant_of(bytes.fromhex(b["namespace_id"]))

    def tables(d: dict[str, Any]) -> list[Any]:
        from kvstored.units import format_size

        rows = [(b["key"], b["namespace_id"][:16] or "-", b["tier"], format_size(b["size_bytes"]),
                 b["generation"], state_label(b["state"], copy=b["copy"])) for b in d["blocks"]]
        title = (f"blocks indexed on {d['node_id']} (epoch {d['epoch']}): {d['count']} of "
                 f"{d['num_replicas']}"
                 + (f", more with --page-token {d['next_page_token']}" if d["truncated"] else ""))
        return [output.rows_table(title, ["key", "namespace", "tier", "size", "generation",
                                          "state"], rows)]

    output.emit(obj.output, data, tables, min_width=140)


def _targets_of_keys(m: Any, ns: bytes, keys: list[bytes], node: str | None
                     ) -> tuple[dict[tuple[str, str], dict[bytes, list[bytes]]], list[bytes]]:
    targets: dict[tuple[str, str], dict[bytes, list[bytes]]] = {}
    not_indexed = []
    per_key, _ = m.list_replicas(ns, keys)
    for key, reps in zip(keys, per_key, strict=True):
        holders = {(r["node_id"], r["grpc_address"]) for r in reps
                   if node is None or r["node_id"] == node}
        if not holders:
            not_indexed.append(key)
        for h in holders:
            targets.setdefault(h, {}).setdefault(ns, []).append(key)
    return targets, not_indexed


def _targets_of_prefix(m: Any, ns: bytes | None, prefix: str, node: str | None
                       ) -> dict[tuple[str, str], dict[bytes, list[bytes]]]:
    text = prefix.strip().lower()
    if not text or any(ch not in "0123456789abcdef" for ch in text):
        raise InvalidArgument(f"--prefix {prefix!r} is not hex")
    nodes = {n["node_id"]: n["grpc_address"] for n in m.list_nodes()["nodes"]}
    targets: dict[tuple[str, str], dict[bytes, list[bytes]]] = {}
    for node_id in sorted(nodes) if node is None else [node]:
        seen = set()
        for b in m.iter_node_blocks(node_id, namespace_id=ns):
            if b["key"].startswith(text) and (b["namespace_id"], b["key"]) not in seen:
                seen.add((b["namespace_id"], b["key"]))
                targets.setdefault((node_id, nodes[node_id]), {}).setdefault(
                    bytes.fromhex(b["namespace_id"]), []).append(bytes.fromhex(b["key"]))
    return targets


def evict(obj: Any, keys: list[bytes], prefix: str | None, namespace_hex: str | None,
          node: str | None, exit_fn: Callable[[int], None]) -> None:
    """Remove blocks cluster-wide (or from ``node``) through each holder's Remove RPC."""
    if bool(keys) == (prefix is not None):
        raise InvalidArgument("give block keys (KEY_HEX... or --keys) or --prefix HEX, not both "
                              "and not neither")
    require_master(obj, "evict")
    with master_client(obj) as m:
        if node is not None:
            _check_node(m, node)
        ns = resolve_namespace(m, namespace_hex) if namespace_hex is not None else None
        not_indexed: list[bytes] = []
        if keys:  # keys without --namespace-id: the empty namespace of --tenant
            targets, not_indexed = _targets_of_keys(
                m, ns if ns is not None else obj.scoped(b""), keys, node)
        else:
            assert prefix is not None
            targets = _targets_of_prefix(m, ns, prefix, node)
        done = m.evict(targets)
    nodes = [e.to_dict() for e in done]
    data = {"num_removed": sum(len(n["removed"]) for n in nodes),
            "num_kept": sum(len(n["kept"]) for n in nodes),
            "num_not_indexed": len(not_indexed), "not_indexed": [k.hex() for k in not_indexed],
            "nodes": nodes}

    def tables(d: dict[str, Any]) -> list[Any]:
        rows = [(n["node_id"], n["grpc_address"], n["num_requested"], len(n["removed"]),
                 len(n["kept"]), n["error"] or "") for n in d["nodes"]]
        title = (f"evicted {d['num_removed']} replicas ({d['num_kept']} kept: pinned or gone; "
                 f"{d['num_not_indexed']} keys not indexed)")
        return [output.rows_table(title, ["node", "address", "asked", "removed", "kept",
                                          "error"], rows)]

    output.emit(obj.output, data, tables, min_width=120)
    failed = [n for n in nodes if n["error"]]
    if failed:  # the report above is complete; say why the exit code is 4
        sys.stderr.write(f"kvstorectl: {len(failed)} holder node(s) could not be asked: "
                         + "; ".join(f"{n['node_id']}: {n['error']}" for n in failed) + "\n")
        exit_fn(EXIT_HOLDER_FAILED)


def evict_command(*, keys_command_cls: type[click.Command], common_options: Any,
                  handle_errors: Any, parse_hex: Callable[[str, str], bytes]) -> click.Command:
    """The ``evict`` click command, built from kvstorectl's helpers (passed in, so that
    ``python -m kvstored.cli.kvstorectl`` never imports a second copy of that module)."""
    KeysInOrderCommand = keys_command_cls  # noqa: N806
    _common_options, _handle_errors, _parse_hex = common_options, handle_errors, parse_hex

    @click.command(cls=KeysInOrderCommand, name="evict")
    @click.argument("keys_args", nargs=-1, metavar="[KEY_HEX]...")
    @click.option("--keys", "keys_opt", multiple=True, metavar="HEX[,HEX...]",
                  help="Block keys in hex (repeatable, comma or space separated).")
    @click.option("--prefix", metavar="HEX",
                  help="Every indexed block whose key starts with these hex digits.")
    @click.option("--namespace-id", "namespace_hex", metavar="HEX",
                  help="Namespace of the keys (32 hex digits or a unique prefix); default: "
                       "the empty namespace for keys, every namespace for --prefix.")
    @click.option("--node", metavar="NODE_ID", help="Only this node's replicas.")
    @_common_options
    @click.pass_obj
    @_handle_errors
    def evict_cmd(obj: Any, keys_args: tuple[str, ...], keys_opt: tuple[str, ...],
                  prefix: str | None, namespace_hex: str | None, node: str | None) -> None:
        """Remove blocks from every node holding them (--address MASTER)."""
        hex_keys = [k for raw in (*keys_args, *keys_opt) for k in raw.replace(",", " ").split()]
        keys = [_parse_hex(k, "key") for k in hex_keys]
        check_key_lengths(keys)
        evict(obj, keys, prefix, namespace_hex, node, click.get_current_context().exit)

    return evict_cmd

