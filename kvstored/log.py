"""structlog over the stdlib logging module, set up once per process.

Every line of the process goes through one stdlib handler on stderr whose formatter is
``structlog.stdlib.ProcessorFormatter``: kvstored's own structlog events and the plain
``logging`` records of any library (grpc, asyncio, py.warnings...) come out in the same
stream, rendered the same way: JSON lines (``--log-format json``, set under systemd, one
object per line for journald) or a console renderer. Each line carries ``timestamp`` (UTC
ISO 8601), ``level``, ``logger`` and the process fields bound by :func:`bind_process`
(``node_id``); request lines add what the gRPC adapters bind per call (``request_id``,
``peer``, ``method``).

Never log payload bytes or token ids: log sizes and counts, and keys only as 16-hex-char
block hashes (tests/e2e/test_logs.py greps a run's log for a payload marker).

What does not pass through Python's logging: grpc's C core writes its own lines to stderr
(quiet unless ``GRPC_VERBOSITY`` is raised), and RocksDB writes its LOG file in the SSD
index directory.
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar, Token
from typing import Any, Literal

import structlog

LogFormat = Literal["json", "console"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "console")

_process_fields: dict[str, Any] = {}
_request_fields: ContextVar[Mapping[str, Any] | None] = ContextVar("kvstored_request_fields", default=None)


def bind_process(**fields: Any) -> None:
    """Add fields to every later log line of this process (e.g. ``node_id``), whatever the
    task, thread or library that logs it."""
    _process_fields.update(fields)


def new_request_id() -> str:
    """A fresh request id: 12 hex characters (48 random bits)."""
    return secrets.token_hex(6)


def bind_request(fields: Mapping[str, Any]) -> Token[Mapping[str, Any] | None]:
    """Name the request this task (or thread) is serving on every line it logs until
    :func:`unbind_request`: ``fields`` such as ``request_id``, ``peer``, ``method``.

    One context variable holding the caller's dict: cheap enough for the shm control
    channel's hot path (a fraction of structlog's ``bound_contextvars`` for three keys). The
    caller may update ``fields`` inside the scope (e.g. ``method`` once it is parsed); a
    nested call replaces them until its own token is unbound (innermost first). A Mapping
    that makes its fields when first read (the master's per-call fields) is read only when a
    line is logged.
    """
    return _request_fields.set(fields)


def unbind_request(token: Token[Mapping[str, Any] | None]) -> None:
    """End the scope :func:`bind_request` returned ``token`` for."""
    _request_fields.reset(token)


def _add_request_fields(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    fields = _request_fields.get()
    if fields:
        for key, value in fields.items():
            event_dict.setdefault(key, value)
    return event_dict


def _add_process_fields(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in _process_fields.items():
        event_dict.setdefault(key, value)
    return event_dict


def request_lines_enabled(logger_name: str) -> bool:
    """Whether per-request debug lines (``rpc_served``...) of ``logger_name`` would be kept.

    They are emitted only then: a process that never called :func:`configure` (a library
    user, an in-process test) keeps stdlib's WARNING level, and structlog's unconfigured
    default would otherwise print every one to stdout.
    """
    return logging.getLogger(logger_name).isEnabledFor(logging.DEBUG)


def configure(*, json: bool = False, level: str = "info", stream: Any = None) -> None:
    """Route structlog and stdlib logging into one handler on ``stream`` (default stderr).

    Args:
        json: JSON lines (True) or the console renderer.
        level: debug, info, warning or error (the root logger's level: it applies to
            libraries' records as well).
        stream: a text stream (tests pass a StringIO).

    Raises:
        ValueError: unknown level name (names the value received).
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        _add_request_fields,
        _add_process_fields,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
