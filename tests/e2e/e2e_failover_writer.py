"""A put storm that records each put's replica outcome:
``python e2e_failover_writer.py ADDRESS WRITER REPLICAS OUT STOP``.

Puts ``key_of(WRITER, i)`` (``small_value_for`` values, one key per put, ``replicas=REPLICAS``)
until the file ``STOP`` exists. After each stored key it appends one line to ``OUT`` (flushed):
``KEYHEX WRITTEN WANTED ERRORNAME MONOTONIC_S MESSAGE`` (``ERRORNAME`` is the PutResult's
``replica_error`` class, ``-`` when none; ``MESSAGE`` its text). Errors the client documents as
retriable (Unavailable, DeadlineExceeded, NoCapacity) on the put itself are retried and counted;
any other error ends the writer with a traceback. Prints ``done STORED RETRIES`` at the end.
"""

from __future__ import annotations

import os
import sys
import time

from e2e_helpers import key_of, small_value_for

from kvstored import Client
from kvstored.errors import DeadlineExceeded, NoCapacity, Unavailable


def main() -> None:
    address, writer, replicas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out_path, stop_path = sys.argv[4], sys.argv[5]
    stored = retries = 0
    with Client(address, timeout_s=15) as c, open(out_path, "a") as out:
        while not os.path.exists(stop_path):
            key = key_of(writer, stored)
            try:
                r = c.put([key], [small_value_for(key)], replicas=replicas)[0]
            except (Unavailable, DeadlineExceeded, NoCapacity):
                retries += 1
                continue
            if not r.ok:
                raise AssertionError(f"put of {key.hex()} failed: {r.error!r}")
            err = r.replica_error
            name = type(err).__name__ if err is not None else "-"
            msg = str(err).replace("\n", " ") if err is not None else ""
            out.write(f"{key.hex()} {r.replicas_written} {r.replicas_wanted} {name} "
                      f"{time.monotonic():.3f} {msg}\n")
            out.flush()
            stored += 1
    print("done", stored, retries, flush=True)


if __name__ == "__main__":
    main()
