"""A spill hook for node processes (``KVSTORED_TEST_SPILL_HOOK=spill_hold:hold``).

At the spill point named by ``SPILL_HOLD_AT`` (``put_started`` or ``sent``, see
kvstored/node/spill.py) it writes what the spiller holds (keys, generations, target nodes)
as JSON to ``SPILL_HOLD_FILE`` and blocks that spill thread for good, so the test can
SIGKILL the node exactly there.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

_forever = threading.Event()


def hold(event: str, moves: list[Any], **_: Any) -> None:
    if event != os.environ.get("SPILL_HOLD_AT"):
        return
    path = os.environ["SPILL_HOLD_FILE"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump([{"key": m.block.key.hex(), "generation": m.generation, "node_id": m.node_id,
                    "ok": m.ok} for m in moves], f)
    os.replace(tmp, path)  # the test sees the whole file or none
    _forever.wait()
