"""A client process for the fencing e2e tests: ``python e2e_fence_client.py ADDRESS OP KEY SIZE TIMEOUT``.

OP ``put``: put one SIZE-byte block (value from :func:`big_value`) over shared memory. A hook
(kvstored.client._hooks) holds the copy half-way: the process prints ``copy_mid`` and waits
for a line on stdin, so the test can SIGSTOP or SIGKILL it at a known point. Then it prints
``result stored`` / ``result exists`` / ``error <ErrorClass>``.

OP ``get-into``: read the block into a buffer, held half-way like ``put`` (``copy_mid``), then
print ``result <n>`` or ``error <ErrorClass>``, and ``bytes ok`` / ``bytes foreign`` for what
the buffer holds.

OP ``get-exit``: read the block once (no hook), print ``got <n>``, and exit without close().
"""

from __future__ import annotations

import sys

import numpy as np

from kvstored import Client, KvstoredError
from kvstored.client import _hooks


def big_value(key: bytes, size: int) -> bytes:
    """The one correct value of a key at a given size."""
    return np.random.default_rng(int.from_bytes(key[:8], "little")).integers(
        0, 256, size, dtype=np.uint8
    ).tobytes()


def _hold(event: str, **_fields: object) -> None:
    if event in ("shm_copy_in_mid", "shm_copy_out_mid"):
        print("copy_mid", flush=True)
        sys.stdin.readline()


def main() -> None:
    address, op, key_hex, size, timeout_s = sys.argv[1:6]
    key, n = bytes.fromhex(key_hex), int(size)
    value = big_value(key, n)
    c = Client(address, transport="shm", timeout_s=float(timeout_s))
    c.describe()
    if op == "get-exit":
        print("got", len(c.get([key])[0] or b""), flush=True)
        return  # no close(): interpreter exit must release everything
    _hooks.install(_hold)
    if op == "get-into":
        buf = np.zeros(n, dtype=np.uint8)
        try:
            print("result", c.get_into([key], [buf])[0], flush=True)
        except KvstoredError as exc:
            print("error", type(exc).__name__, flush=True)
        print("bytes", "ok" if bytes(buf) == value else "foreign", flush=True)
        c.close()
        return
    try:
        r = c.put([key], [value])[0]
        if r.error is not None:  # a reserve-ahead slot's lapse is the item's error
            print("error", type(r.error).__name__, flush=True)
        else:
            print("result", "stored" if r.stored else "exists", flush=True)
    except KvstoredError as exc:
        print("error", type(exc).__name__, flush=True)
    c.close()


if __name__ == "__main__":
    main()
