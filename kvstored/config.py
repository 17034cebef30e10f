"""Typed configuration and the one loader.

Precedence: defaults < TOML file (``--config``) < env vars ``KVSTORED_<SECTION>__<FIELD>``
(e.g. ``KVSTORED_NODE__DRAM_SIZE_BYTES=2GiB``) < CLI flags. Unknown keys are errors that name
the key. Sizes accept human strings (``"64GiB"``) and are stored as int ``*_bytes``.

Example TOML::

    [node]
    listen = ["unix:/run/kvstored/node.sock", "127.0.0.1:7070"]
    dram_size_bytes = "8GiB"
    ssd_dir = "/var/lib/kvstored/ssd"
    ssd_size_bytes = "200GiB"
"""

from __future__ import annotations

import os
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any

import platformdirs
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from kvstored.errors import ConfigInvalid, InvalidArgument
from kvstored.units import parse_size

DEFAULT_GRPC_PORT = 7070
DEFAULT_DATA_PORT = 7071
DEFAULT_METRICS_PORT = 7072


def _size(v: Any) -> int:
    try:
        return parse_size(v)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


Size = Annotated[int, BeforeValidator(_size)]


def default_runtime_dir() -> pathlib.Path:
    """Where the daemon puts its unix socket by default (per user, on local disk)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return pathlib.Path(base) / "kvstored"
    return pathlib.Path(f"/tmp/kvstored-{os.getuid()}")


def default_socket_path() -> pathlib.Path:
    """The default unix socket of the local node daemon."""
    return default_runtime_dir() / "node.sock"


def default_address() -> str:
    """The address a client uses when none is given: ``$KVSTORED_ADDRESS`` or the unix socket."""
    return os.environ.get("KVSTORED_ADDRESS") or f"unix:{default_socket_path()}"


def default_ssd_dir() -> pathlib.Path:
    """SSD tier directory under the user's data dir."""
    return pathlib.Path(platformdirs.user_data_dir("kvstored")) / "ssd"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class NodeConfig(_Model):
    """Settings of one node daemon (``[node]`` in the TOML file)."""

    node_id: str = Field(default_factory=lambda: os.uname().nodename)
    """Node name shown by kvstorectl; default: the host name."""
    listen: list[str] = Field(
        default_factory=lambda: [f"unix:{default_socket_path()}", f"127.0.0.1:{DEFAULT_GRPC_PORT}"]
    )
    """gRPC listen addresses: ``unix:PATH`` or ``HOST:PORT`` (loopback by default)."""
    data_address: str = f"127.0.0.1:{DEFAULT_DATA_PORT}"
    """TCP data-plane listen address (bulk bytes for clients without the arena); port 0 = any."""
    metrics_address: str = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
    """Prometheus /metrics listen address; empty string disables it."""
    dram_size_bytes: Size = Field(default=1 << 30, gt=0)
    """Hard cap of the DRAM tier (shared-memory arena), bytes. Default 1 GiB."""
    arena_dir: pathlib.Path = pathlib.Path("/dev/shm")
    """Directory (tmpfs) holding the shared-memory arena file."""
    ssd_dir: pathlib.Path | None = Field(default_factory=default_ssd_dir)
    """SSD tier directory; None disables the SSD tier."""
    ssd_size_bytes: Size = Field(default=4 << 30, ge=0)
    """Hard cap of the SSD tier, bytes. Default 4 GiB; 0 disables the SSD tier."""
    ssd_direct_io: bool = True
    """Read SSD blocks with O_DIRECT when the filesystem supports it."""
    max_block_bytes: Size = Field(default=64 << 20, gt=0)
    """Largest block accepted, bytes. Default 64 MiB."""
    max_batch_keys: int = Field(default=8192, gt=0)
    """Most keys in one batched call."""
    max_inline_bytes: Size = Field(default=1 << 20, ge=0)
    """Largest total payload carried inline in one gRPC Put/Get; larger goes via arena/TCP."""
    min_key_bytes: int = Field(default=16, gt=0)
    """Shortest key accepted (128-bit block hashes)."""
    max_key_bytes: int = Field(default=64, gt=0)
    """Longest key accepted."""
    pin_lease_s: float = Field(default=30.0, gt=0)
    """Default lease of a shared-memory pin / put reservation, seconds. A lease that lapses
    puts its space in quarantine (never straight back in the free pool) until the client's
    session ends or it acknowledges (kvstored/node/sessions.py)."""
    max_quarantine_bytes_per_session: Size = Field(default=1 << 30, ge=0)
    """Most quarantined bytes (lapsed pins/reservations not yet acknowledged) one client
    session may hold; over it, that session's new pins and reservations get NoCapacity.
    Default 1 GiB."""
    drain_grace_s: float = Field(default=10.0, ge=0)
    """On SIGTERM: how long in-flight requests may take to finish, seconds."""
    spill_on_shutdown: bool = True
    """On SIGTERM: demote DRAM-only blocks to the SSD tier so they survive a restart."""
    log_json: bool = False
    """Render logs as JSON lines (set under systemd)."""
    log_level: str = "info"
    """debug, info, warning or error."""


class KvstoredConfig(_Model):
    """Root configuration."""

    node: NodeConfig = Field(default_factory=NodeConfig)


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigInvalid(f"config key {'.'.join(path)} conflicts with a scalar value")
    node[path[-1]] = value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith("KVSTORED_") or "__" not in key:
            continue
        path = [p.lower() for p in key[len("KVSTORED_") :].split("__")]
        parsed: Any = value
        if value.startswith("["):  # lists such as listen=["unix:/x", "127.0.0.1:1"]
            try:
                parsed = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError as exc:
                raise ConfigInvalid(f"env var {key}: cannot parse list {value!r}: {exc}") from None
        _set_path(tree, path, parsed)
    return tree


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> KvstoredConfig:
    """Load the configuration: defaults < TOML file < env vars < ``overrides`` (CLI flags).

    Args:
        path: a TOML file, or None.
        overrides: nested dict such as ``{"node": {"dram_size_bytes": "2GiB"}}``; None values
            are ignored (flags not given).
        environ: environment to read (default ``os.environ``).

    Raises:
        ConfigInvalid: unreadable file, bad TOML, unknown key or invalid value; the message names
            the key and the value received.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                tree = tomllib.load(fh)
        except OSError as exc:
            raise ConfigInvalid(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigInvalid(f"config file {path} is not valid TOML: {exc}") from None
    tree = _merge(tree, _env_overrides(os.environ if environ is None else environ))
    if overrides:
        clean = {
            sec: {k: v for k, v in vals.items() if v is not None}
            for sec, vals in overrides.items()
        }
        tree = _merge(tree, clean)
    try:
        return KvstoredConfig.model_validate(tree)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']} (got {err.get('input')!r})"
            for err in exc.errors()
        )
        raise ConfigInvalid(f"invalid configuration: {problems}") from None
