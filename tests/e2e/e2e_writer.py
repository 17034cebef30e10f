"""A put storm for the SIGKILL test: ``python e2e_writer.py ADDRESS TRANSPORT SEED``.

Puts batches of fresh keys whose values are derived from the keys (see e2e_helpers.value_for)
until killed or until the node is gone; prints one line per committed batch.
"""

from __future__ import annotations

import random
import sys

from e2e_helpers import value_for

from kvstored import Client, KvstoredError


def main() -> None:
    address, transport, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    with Client(address, transport=transport, timeout_s=5) as c:
        while True:
            keys = [rng.randbytes(16) for _ in range(8)]
            try:
                c.put(keys, [value_for(k) for k in keys])
            except KvstoredError:
                return
            print("batch", flush=True)


if __name__ == "__main__":
    main()
