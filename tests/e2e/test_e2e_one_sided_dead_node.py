"""One-sided shm reads never serve a dead node's blocks: after the node is SIGKILLed its
arena file still holds the last bytes (nobody unlinks or writes it), and a client that mapped
it must not read them without a round trip. The client's OpenSession stream is the node's
liveness (it ends with the process, no timer): a get or a lookup after the stream ended fails
over to the node, which is gone (Unavailable), instead of answering from the stale mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import ServeProcess, value_for
from helpers import key
from thread_helpers import wait_until

from kvstored import Client
from kvstored.client import _shm
from kvstored.errors import Unavailable


def test_a_sigkilled_nodes_arena_is_not_read_one_sided(workdir: Path, procs: list[Any]) -> None:
    node = ServeProcess(workdir)
    procs.append(node)
    node.start()
    assert node.proc is not None
    keys = [key(i) for i in range(4)]
    values = [value_for(k) for k in keys]
    with Client(node.unix_address) as c:
        c.put(keys, values)
        hits0 = _shm.ONE_SIDED_STATS["hits"]
        assert c.get(keys) == values
        assert _shm.ONE_SIDED_STATS["hits"] - hits0 == len(keys), "the get was not one-sided"
        assert c.lookup_prefix(keys) == len(keys)
        node.proc.kill()  # the arena file stays: ServeProcess.kill would unlink it
        node.proc.wait(30)
        assert Path(node.arena).exists()
        session = c._session  # the reader thread sees the stream end (event, not a timer)
        wait_until(lambda: session._ended.is_set(), what="the session stream to end")
        hits1 = _shm.ONE_SIDED_STATS["hits"]
        with pytest.raises(Unavailable):
            c.get(keys)
        with pytest.raises(Unavailable):
            c.lookup_prefix(keys)
        assert _shm.ONE_SIDED_STATS["hits"] == hits1, "a dead node's block was read one-sided"
