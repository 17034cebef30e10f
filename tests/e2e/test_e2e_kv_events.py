"""KV events for routers, end to end in the vLLM venv: a real ``kvstored master
--events-endpoint`` and two real nodes; vLLM's own ``msgspec.msgpack.Decoder(KVEventBatch)``
decodes what the master published, and a router built on vLLM's event classes picks the node
the master's ``where`` names. (Without the vLLM venv, tests/e2e/test_readme_events.py runs
the same cluster, router and ``kvstorectl events`` from the README.)

Waits poll with a deadline (real processes, real time); the orders are pinned by the unit
tests in tests/unit/master/test_master_events.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import MasterProcess, NodeProcess, _keys, _put, _wait, start_each

from kvstored.client.events import EventSubscriber
from kvstored.client.master import MasterClient
from kvstored.integrations.router import PrefixRouter, RoutePick

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parents[1]

pytestmark = pytest.mark.timeout(120)


def _cluster(workdir: Path, procs: list[Any]) -> tuple[Any, list[bytes], list[bytes]]:
    master = MasterProcess(workdir)
    master.args += ["--events-endpoint", "tcp://127.0.0.1:0",
                    "--events-replay-endpoint", "tcp://127.0.0.1:0"]
    procs.append(master)
    master.start()
    assert master.events.startswith("tcp://127.0.0.1:") and master.events_replay
    n1, n2 = (NodeProcess(workdir / n, master.address, n) for n in ("ev-n1", "ev-n2"))
    start_each([n1, n2], procs)
    a, b = _keys(6), _keys(3)
    _put(n1, a)
    _put(n2, b)
    return master, a, b


def _where_pick(m: MasterClient, request: list[bytes]) -> RoutePick:
    """The master's answer: the node of the first block, and how many leading blocks that
    node holds (each key looked up alone: ``kvstorectl where`` per key)."""
    nodes = []
    for k in request:
        got, _ = m.lookup_prefix(b"", [k])
        nodes.append({r.node_id for r in got})
    if not nodes or not nodes[0]:
        return RoutePick(None, 0)
    node = sorted(nodes[0])[0]
    n = 0
    while n < len(nodes) and node in nodes[n]:
        n += 1
    return RoutePick(node, n)


def _router(master: Any) -> PrefixRouter:
    r = PrefixRouter()
    with EventSubscriber(master.events, master.events_replay) as sub:
        for _, batch in sub.replay(0):
            r.apply_batch(batch)
    return r


def _vllm_python() -> str | None:
    from kvstored.demo.vllm_demo import VllmUnavailable, find_vllm_python

    try:
        return str(find_vllm_python())
    except VllmUnavailable:
        return None


@pytest.mark.vllm
def test_vllms_decoder_reads_the_events_and_its_router_picks_where_the_master_says(
    workdir: Path, procs: list[Any]
) -> None:
    python = _vllm_python()
    if python is None:
        pytest.skip("needs the vLLM venv (KVSTORED_VLLM_PYTHON or .venv-vllm)")
    master, a, b = _cluster(workdir, procs)
    request = b[:2] + a
    with MasterClient(master.address) as m:
        want = _wait("every block indexed",
                     lambda: (w if (w := _where_pick(m, request)) == RoutePick("ev-n2", 2)
                              else None))
        _wait("the events caught up", lambda: _router(master).pick(request) == want)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(E2E_DIR)])}
    out = subprocess.run(
        [python, str(E2E_DIR / "kv_events_vllm_router.py"), master.events_replay,
         ",".join(k.hex() for k in request)],
        capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["same_bytes"] is True
    assert got["pick"] == [want.node_id, want.num_blocks]
    decoded = got["vllm_decoded"]
    assert decoded[0]["type"] == "AllBlocksCleared"
    seen = {h for e in decoded if e["type"] == "BlockStored" for h in e["block_hashes"]}
    assert {k.hex() for k in a + b} <= seen
    assert {e["medium"] for e in decoded[1:]} == {"CPU"}
