"""What kvstorectl's commands share: ``ctx.obj`` (:class:`CtlContext`), the per-command
``--address/--timeout-s/--output`` options, error-to-exit-code mapping, and the exit codes.

Used by kvstored/cli/kvstorectl.py, kvstored/cli/cluster.py and kvstored/cli/scheduler.py.
Exit codes (named constants, stable for scripts): 0 ok, 1 error (a bug or an OS error),
2 bad arguments, 3 node or master unreachable, 4 server error.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from kvstored.addresses import default_address, is_unix_address, unix_socket_path
from kvstored.cli import output
from kvstored.errors import DeadlineExceeded, InvalidArgument, KvstoredError, Unavailable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_ARGS = 2
EXIT_UNREACHABLE = 3
EXIT_SERVER_ERROR = 4

F = TypeVar("F", bound=Callable[..., Any])

WATCH_HELP = ("Keep the view live: refresh every --interval-s until Ctrl-C or --count; with "
              "--output json, one JSON document per line and refresh.")
INTERVAL_HELP = "With --watch: seconds between refreshes."
DEFAULT_WATCH_INTERVAL_S = 2.0


@dataclass
class CtlContext:
    """What every kvstorectl command receives as ``ctx.obj``."""

    address: str | None
    timeout_s: float
    output: str
    tenant: str = ""
    """``--tenant``: the tenant whose blocks the command addresses (docs/tenants.md)."""
    watch: bool = False
    """``--watch``: keep the view live (status, stats, nodes)."""
    interval_s: float = DEFAULT_WATCH_INTERVAL_S
    """``--interval-s``: seconds between ``--watch`` refreshes."""
    count: int | None = None
    """``--count``: stop watching after this many refreshes (None: until Ctrl-C)."""

    def watch_s(self) -> float | None:
        """Seconds between refreshes when ``--watch`` is on (``--count`` alone implies it),
        else None."""
        return self.interval_s if (self.watch or self.count is not None) else None

    def scoped(self, namespace_id: bytes) -> bytes:
        """The stored namespace id of ``namespace_id`` in ``--tenant`` (what a master
        indexes and a node stores).

        Raises:
            InvalidArgument: ``--tenant`` is not a tenant name.
        """
        from kvstored.tenancy import scope_namespace

        return scope_namespace(self.tenant, namespace_id)
    tls: Any = None
    """The :class:`kvstored.security.tls.TlsFiles` of ``--tls-*`` / ``--config`` / the
    ``KVSTORED_TLS__*`` env vars (:func:`resolve_tls`), or None = plaintext."""

    def client(self, namespace: Any = None) -> Any:
        """A client for admin calls (gRPC only: admin calls never move bulk bytes).

        Raises:
            Unavailable: at once (not after ``--timeout-s``) when the address is a unix
                socket that does not exist, is not a socket, or refuses connections.
        """
        from kvstored.client import Client

        check_unix_socket(self.address or default_address())
        return Client(self.address, timeout_s=self.timeout_s, namespace=namespace, transport="grpc",
                      tenant=self.tenant, tls=self.tls if self.tls is not None else False)


def resolve_tls(cert: str | None, key: str | None, ca: str | None, config_path: str | None) -> Any:
    """kvstorectl's TLS files: ``--tls-cert/--tls-key/--tls-ca`` (all three), else the
    ``[tls]`` of ``--config FILE``, else the ``KVSTORED_TLS__*`` env vars; None = plaintext.

    Raises:
        click.UsageError: only some flags given, or a file is unreadable, not PEM, or the
            key does not match the certificate (exit 2, naming the flag or key).
    """
    from kvstored.config import load_config
    from kvstored.errors import ConfigInvalid
    from kvstored.security.tls import TlsFiles, tls_from_env

    flags = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
    try:
        if any(flags.values()):
            missing = [f for f, v in flags.items() if not v]
            if missing:
                raise click.UsageError(f"TLS needs --tls-cert, --tls-key and --tls-ca together; "
                                       f"missing {', '.join(missing)}")
            assert cert and key and ca
            return TlsFiles.load(cert, key, ca, source="--tls-cert/--tls-key/--tls-ca")
        if config_path is not None:
            return TlsFiles.from_config(load_config(config_path).tls)
        return tls_from_env()
    except ConfigInvalid as exc:
        raise click.UsageError(str(exc)) from None


def check_unix_socket(address: str) -> None:
    """Fail fast for a ``unix:`` address nobody can be listening on (TCP addresses pass).

    Raises:
        Unavailable: the socket file is missing, is not a socket, or refuses connections;
            the message names the path.
    """
    import os
    import socket
    import stat

    if not is_unix_address(address):
        return
    try:
        path = unix_socket_path(address)
    except InvalidArgument:  # an empty path: reported below as a missing socket file
        path = ""
    hint = "is kvstored running? start it with `kvstored serve`, or pass --address"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise Unavailable(f"no kvstored socket at {path}: the file does not exist; {hint}") from None
    except OSError as exc:
        raise Unavailable(f"cannot reach the socket {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise Unavailable(f"{path} is not a unix socket; {hint}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            raise Unavailable(
                f"nothing listens on {path} (a stale socket of a stopped daemon); {hint}"
            ) from None
        except PermissionError:
            raise Unavailable(
                f"permission denied connecting to {path}: run as the daemon's user or its group"
            ) from None
        except OSError:
            pass  # let the client report it within its deadline





MASTER_VIEWS = "`kvstorectl nodes`, `where KEY...`, `blocks --node NODE_ID`"
"""The commands that ask a master, as a message about a node command sent to one names them."""


@contextlib.contextmanager
def asks_a_node(obj: CtlContext, command: str) -> Iterator[None]:
    """Turn a node-only command's failure against a master's address into one clear line.

    A master answers a node's methods UNIMPLEMENTED (kvstored/rpc_status.py: an
    InvalidArgument saying "the other kind of kvstored process"); when that happens, one
    ``ListNodes`` probe tells a master from anything else, and a master gets
    ``ADDR is a master, not a node: ...`` (still InvalidArgument: exit 2, a wrong address).

    Args:
        obj: kvstorectl's context (``address``, ``timeout_s``, ``tls``).
        command: the command's name, for the message (``"status"``).

    Raises:
        InvalidArgument: the address is a master's (the message names it, the command and the
            master's views); any other failure passes unchanged.
    """
    try:
        yield
    except InvalidArgument as exc:
        if not str(exc).startswith("UNIMPLEMENTED") or not obj.address or is_unix_address(obj.address):
            raise
        from kvstored.cli.cluster import is_master_address

        try:
            master = is_master_address(obj)
        except KvstoredError:
            raise exc from None
        if not master:
            raise
        raise InvalidArgument(
            f"{obj.address} is a master, not a node: `kvstorectl {command}` asks a node (give "
            f"--address NODE_HOST:PORT or its unix:PATH); ask the master with {MASTER_VIEWS}"
        ) from None


def _override(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None and isinstance(ctx.obj, CtlContext):
        setattr(ctx.obj, param.name or "", value)
    return value


def common_options(fn: F) -> F:
    """``--address``, ``--timeout-s``, ``--output`` and ``--tenant`` also after the command name."""
    for decorator in (
        click.option("--tenant", default=None, expose_value=False, callback=_override,
                     is_eager=True, help="Same as the global --tenant."),
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


WATCHABLE = ("status", "stats", "nodes")
"""The commands ``--watch`` applies to (a live view of a node or of the cluster)."""


def watch_options(fn: F) -> F:
    """``--watch``, ``--interval-s`` and ``--count`` after the command name (status, stats,
    nodes); each also exists as a global flag."""
    fn = click.option("--count", type=click.IntRange(min=1), default=None, expose_value=False,
                      callback=_override, help="Same as the global --count.")(fn)
    fn = click.option("--interval-s", type=click.FloatRange(min=0.05), default=None,
                      expose_value=False, callback=_override, help=INTERVAL_HELP)(fn)
    return click.option("--watch", is_flag=True, default=None, expose_value=False,
                        callback=_override, help=WATCH_HELP)(fn)


NOT_TLS_CAUSES = ("did not answer", "no master leads under")
"""Phrases of failures TLS cannot cause (a TLS server closes a plaintext connection at once:
it never connects and then stays silent, and etcd naming no leader is not the master's TLS)."""


def _tls_hint(obj: Any, message: str = "") -> str:
    """A hint for an unreachable TCP address when kvstorectl has no TLS (the server may
    require a client certificate: a plaintext client only sees the connection close); none
    for a failure TLS cannot cause (:data:`NOT_TLS_CAUSES`)."""
    if not isinstance(obj, CtlContext) or obj.tls is not None:
        return ""
    if any(phrase in message for phrase in NOT_TLS_CAUSES):
        return ""
    if obj.address is None or is_unix_address(obj.address):
        return ""
    return " (if the server uses TLS, pass --tls-cert, --tls-key and --tls-ca)"


def handle_errors(fn: F) -> F:
    """Map failures to exit codes and print them (JSON in json mode)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        out = ctx.obj.output if isinstance(ctx.obj, CtlContext) else "table"
        try:
            return fn(*args, **kwargs)
        except (Unavailable, DeadlineExceeded) as exc:
            output.emit_error(out, exc.code.name, str(exc) + _tls_hint(ctx.obj, str(exc)))
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

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature of F
