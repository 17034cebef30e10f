"""Test hook seam of the client: named points where a test can observe or hold an operation.

Not a public API. Production code calls :func:`fire` at a few points; with no hook installed
(the default) that is one global load and one ``is None`` test. A test installs a callable
with :func:`install` (in its own process, or in a child process's script) and may block inside
it (e.g. on a ``threading.Event``) to hold the operation at that point deterministically.

Events (``fire(event, **fields)``):

    shm_copy_in_mid    put: half of the first value is in the reserved arena space, the rest
                       not yet (fields: offset, size_bytes); runs on the copying thread
    shm_copy_in_done   put: every value of the chunk is in the arena, before CommitPut
    shm_copy_out_mid   get_into: half of the first pinned block is copied out (offset,
                       size_bytes)
    shm_copy_out_done  get: every pinned block of the chunk is copied out, before ReleasePins
    shm_one_sided_mid  get: half of a block read one-sided (no pin, kvstored/tiers/slots.py)
                       is copied, before the rest and the version re-check (slot)
    rpc                a unary RPC is about to be sent (method, plus abort= for CommitPut)
    pin_release_deferred  get over the control channel: its copy returned and its pin id
                       (pin_id) waits for the client's next request (kvstored/client/_control.py)
    control_release_sent  a control request carrying deferred pin releases (pin_ids) is about
                       to be sent (method: its op, "" for a bare release)
    orphan_ack         an orphan ack is about to be sent (session_id, request_ids): the
                       ReservePut/PinBlocks with these ids got no answer; a grpc.RpcError
                       raised by the hook counts as the ack's RPC failing

``KVSTORED_TEST_HOOK=module:function`` in the environment installs ``module.function`` when this
module is first imported (for child processes a test cannot reach otherwise).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

Hook = Callable[..., None]

_hook: Hook | None = None


def install(hook: Hook | None) -> Hook | None:
    """Install ``hook(event, **fields)`` (None removes it); returns the previous hook."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def fire(event: str, **fields: Any) -> None:
    """Call the installed hook, if any (from whatever thread reaches the point)."""
    hook = _hook
    if hook is not None:
        hook(event, **fields)


def _install_from_env() -> None:
    spec = os.environ.get("KVSTORED_TEST_HOOK", "")
    if not spec:
        return
    module, _, attr = spec.partition(":")
    install(getattr(importlib.import_module(module), attr))


_install_from_env()
