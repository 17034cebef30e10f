"""A put storm through one node: ``python e2e_cluster_writer.py ADDRESS WRITER MAX_KEYS OUT STOP``.

Puts ``key_of(WRITER, i)`` for i = 0, 1, ... with ``small_value_for`` values, one key per
put, until ``MAX_KEYS`` are stored or the file ``STOP`` exists; after each stored key it
appends the key's hex to ``OUT`` (flushed: the test reads what was committed so far). Errors
the client documents as retriable (Unavailable, DeadlineExceeded, NoCapacity) are retried
and counted; any other error ends the writer with a traceback (exit status 1). Prints
``done STORED RETRIES`` at the end.
"""

from __future__ import annotations

import os
import sys

from e2e_helpers import key_of, small_value_for

from kvstored import Client
from kvstored.errors import DeadlineExceeded, NoCapacity, Unavailable


def main() -> None:
    address, writer, max_keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    out_path, stop_path = sys.argv[4], sys.argv[5]
    stored = retries = 0
    with Client(address, timeout_s=10) as c, open(out_path, "a") as out:
        while stored < max_keys and not os.path.exists(stop_path):
            key = key_of(writer, stored)
            try:
                ok = c.put([key], [small_value_for(key)])[0].stored
            except (Unavailable, DeadlineExceeded, NoCapacity):
                retries += 1
                continue
            if not ok:
                raise AssertionError(f"put of {key.hex()} not stored")
            out.write(key.hex() + "\n")
            out.flush()
            stored += 1
    print("done", stored, retries, flush=True)


if __name__ == "__main__":
    main()
