"""Where the leading master is, and which of its answers to believe (term fencing).

A master address given to a node, a client or kvstorectl is one of::

    HOST:PORT                          one master (as before)
    HOST:PORT,HOST:PORT,...            several masters: the leader is among them
    etcd://HOST:PORT[,HOST:PORT]/PFX   the masters elected under prefix PFX in that etcd

:func:`parse_master_targets` turns it into a :class:`MasterTargets`; callers move to the
leader on ``NotLeader`` (the follower's hint first: :func:`leader_hint`) or ``Unavailable``
(the next address of the list, or the leader's record read from etcd:
:func:`read_leader`). Nothing here retries by itself: a caller tries the next address.

The leader's record is the value of the election key ``PFX/leader`` (written by
kvstored/master/election.py): JSON ``{"addresses": ["HOST:PORT", ...], "name": ...}``; its
etcd create revision is the leader's *term*.

:class:`TermFence` keeps the newest term a process has seen from any master; an answer
from an older term is refused (:class:`~kvstored.errors.StaleTerm`), so a deposed leader
that still answers cannot place, command or answer lookups for a node that already talks to
its successor. One fence is shared by a node's MasterLink, spiller and remote reads.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kvstored.addresses import parse_host_port
from kvstored.errors import InvalidArgument, StaleTerm, Unavailable

LEADER_METADATA_KEY = "kvstored-leader"
"""Trailing metadata of a NotLeader answer: the leader's ``HOST:PORT`` (empty: unknown)."""
TERM_METADATA_KEY = "kvstored-term"
"""Trailing metadata of a NotLeader answer: the newest term the follower knows of."""
LEADER_KEY = "leader"
"""The election key under the prefix: ``PFX/leader``."""
ETCD_SCHEME = "etcd://"


RECONNECT_BACKOFF_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
"""Reconnect backoff of every channel to a master (the node's MasterLink and RemoteReads, the
client's, kvstorectl's) and of the master's own channels to nodes: at most 1 s between
connection attempts. gRPC's default grows to
120 s (1 s x 1.6 per failed attempt), so after a master was down for ten seconds a channel
kept failing fast (Unavailable) for seconds after it was back at the same address: a
read's lookup found no master and missed every key of its batch. Not
``grpc.min_reconnect_backoff_ms``: gRPC core uses it as each attempt's connect timeout
(default 20 s), and 100 ms failed connections whose handshake was slow under load
("connection attempt timed out before receiving SETTINGS frame")."""


@dataclass(frozen=True, slots=True)
class MasterTargets:
    """The masters a caller may talk to.

    Attributes:
        addresses: master ``HOST:PORT`` addresses to try in order (empty with etcd only).
        etcd_endpoints: etcd ``HOST:PORT`` client endpoints (empty: no etcd).
        election_prefix: the election prefix in etcd (``/kvstored`` by default).
    """

    addresses: tuple[str, ...]
    etcd_endpoints: tuple[str, ...] = ()
    election_prefix: str = ""

    @property
    def uses_etcd(self) -> bool:
        """Whether the leader is found through etcd."""
        return bool(self.etcd_endpoints)

    def first(self) -> str:
        """The address to try first ("" with etcd only: read the leader's record first)."""
        return self.addresses[0] if self.addresses else ""


def election_key(prefix: str) -> bytes:
    """The election key of ``prefix`` (``/kvstored`` -> ``b"/kvstored/leader"``)."""
    return f"{prefix.rstrip('/')}/{LEADER_KEY}".encode()


def check_election_prefix(prefix: str, what: str) -> str:
    """``prefix`` if it is a usable election prefix (starts with ``/``, printable, no spaces).

    Raises:
        InvalidArgument: naming ``what`` and the value received.
    """
    if not prefix.startswith("/") or len(prefix) > 256 or not prefix.isprintable() \
            or " " in prefix or prefix.rstrip("/") == "":
        raise InvalidArgument(
            f"{what}: election prefix must start with '/', be 2..256 printable characters "
            f"without spaces and not be only '/', got {prefix!r}")
    return prefix.rstrip("/")


def parse_etcd_endpoints(spec: str, what: str) -> tuple[str, ...]:
    """Parse ``URL[,URL...]`` (``http://HOST:PORT`` or ``HOST:PORT``) into ``HOST:PORT``s.

    Raises:
        InvalidArgument: an empty list, an https URL (no TLS to etcd yet) or a malformed
            entry; the message names ``what`` and the entry.
    """
    out = []
    for raw in spec.split(","):
        entry = raw.strip()
        if entry.startswith("https://"):
            raise InvalidArgument(f"{what}: TLS to etcd is not supported yet, got {entry!r}")
        if entry.startswith("http://"):
            entry = entry[len("http://"):]
        entry = entry.rstrip("/")
        try:
            parse_host_port(entry)
        except InvalidArgument:
            raise InvalidArgument(
                f"{what}: etcd endpoint must be http://HOST:PORT or HOST:PORT, got {raw!r}"
            ) from None
        out.append(entry)
    return tuple(out)


def parse_master_targets(spec: str, what: str = "master address") -> MasterTargets:
    """Parse a master address (see the module docstring).

    Raises:
        InvalidArgument: an empty spec, a malformed ``HOST:PORT``, or an ``etcd://`` spec
            without endpoints or prefix; the message names ``what`` and the value received.
    """
    spec = spec.strip()
    if spec.startswith(ETCD_SCHEME):
        rest = spec[len(ETCD_SCHEME):]
        hosts, sep, prefix = rest.partition("/")
        if not sep or not hosts:
            raise InvalidArgument(
                f"{what}: expected etcd://HOST:PORT[,HOST:PORT]/PREFIX, got {spec!r}")
        return MasterTargets((), parse_etcd_endpoints(hosts, what),
                             check_election_prefix("/" + prefix, what))
    addresses = []
    for raw in spec.split(","):
        entry = raw.strip()
        try:
            parse_host_port(entry)
        except InvalidArgument as exc:
            detail = str(exc) if "out of range" in str(exc) else f"bad entry {raw!r}"
            raise InvalidArgument(
                f"{what}: expected HOST:PORT[,HOST:PORT...] or etcd://HOST:PORT/PREFIX, "
                f"got {spec!r} ({detail})") from None
        addresses.append(entry)
    return MasterTargets(tuple(addresses))


def leader_hint(exc: grpc.RpcError) -> str:
    """The leader's ``HOST:PORT`` a NotLeader answer named in its trailing metadata ("" if none)."""
    trailing_fn = getattr(exc, "trailing_metadata", None)
    trailing = trailing_fn() if callable(trailing_fn) else None
    for key, value in trailing or ():
        if key == LEADER_METADATA_KEY:
            return str(value)
    return ""


def decode_leader_record(value: bytes) -> tuple[str, ...]:
    """The addresses in a leader record (``()`` for a record this version cannot read)."""
    try:
        obj = json.loads(value)
        addresses = obj.get("addresses", [])
    except (ValueError, AttributeError):
        return ()
    return tuple(a for a in addresses if isinstance(a, str))


def encode_leader_record(addresses: Sequence[str], name: str) -> bytes:
    """The leader record a master writes into the election key."""
    return json.dumps({"addresses": list(addresses), "name": name}).encode()


async def read_leader(targets: MasterTargets, *, timeout_s: float) -> tuple[str, int]:
    """The leader's first address and term from etcd (``("", 0)``: no leader right now).

    Tries each etcd endpoint in turn.

    Raises:
        Unavailable: no etcd endpoint answered within ``timeout_s`` each.
    """
    import aetcd  # type: ignore[import-untyped]  # aetcd ships no type information

    errors = []
    for endpoint in targets.etcd_endpoints:
        host, port = parse_host_port(endpoint)
        try:
            async with asyncio.timeout(timeout_s):
                async with aetcd.Client(host=host, port=port, timeout=timeout_s) as client:
                    got: Any = await client.get(election_key(targets.election_prefix))
        except (TimeoutError, aetcd.ClientError, OSError) as exc:
            errors.append(f"{endpoint}: {type(exc).__name__}: {exc}")
            continue
        if got is None:
            return "", 0
        addresses = decode_leader_record(got.value)
        return (addresses[0] if addresses else ""), int(got.create_revision)
    raise Unavailable(f"no etcd endpoint answered: {'; '.join(errors)}")


def read_leader_sync(targets: MasterTargets, *, timeout_s: float) -> tuple[str, int]:
    """:func:`read_leader` for blocking callers (runs its own loop, in a helper thread when
    the calling thread already runs one).

    Raises:
        Unavailable: as :func:`read_leader`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(read_leader(targets, timeout_s=timeout_s))
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(asyncio.run(read_leader(targets, timeout_s=timeout_s)))
        except BaseException as exc:  # handed to the caller below
            box.append(exc)

    t = threading.Thread(target=run, name="kvstored-etcd-read")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    out: tuple[str, int] = box[0]
    return out


class TermFence:
    """The newest master term this process has seen; older answers are refused.

    Thread-safe (the node's loop, its spill thread and its remote-read threads share one).
    A term of 0 (a master older than terms) is neither checked nor recorded.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.term = 0
        self.num_refused = 0

    def observe(self, term: int, what: str) -> None:
        """Accept an answer of ``term`` (recording it when newer) or refuse it.

        Raises:
            StaleTerm: ``term`` is older than the newest seen; names ``what`` and both terms.
        """
        if term <= 0:
            return
        with self._lock:
            if term < self.term:
                self.num_refused += 1
                raise StaleTerm(f"{what}: answer from master term {term}, older than term "
                                f"{self.term} already seen; refused")
            self.term = term
