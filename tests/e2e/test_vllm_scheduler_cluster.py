"""The scheduler places a real request: two vLLM engines on a 2-node cluster (issue 19 §3).

    kvstored master (hosts the SchedulerService)
    node a  <- engine A (KvstoredConnector, registers instances "A", "A/decode" on node a)
    node b  <- engine B (KvstoredConnector, registers instances "B", "B/decode" on node b)
    engine R: B's configuration without the connector (the reference answer)

1. A computes a ~1k-token prompt; its blocks are saved to node a, which reports them to the
   master's index. A then waits (alive, so its instances stay registered).
2. The router (this test) reports A's prefill queue as long (A is busy) and asks Schedule for
   the prompt's keys, waiting for the copy: the scheduler names engine B, node a as the
   prefix's holder, and has node b copy the prefix in (NodeService.Prefetch, the cluster
   get path) before it answers DONE. Node b's counters show the blocks arrived from a peer.
3. Only then B runs the prompt: its load hits the whole prefix on its own node (node b's
   remote-fetch counter does not move), and its answer equals R's token for token.

Engines wait on files the driver writes (no sleeps stand in for synchronisation). Needs the
vLLM venv (scripts/setup-vllm-venv.sh); skipped with the reason otherwise. Run only this test:
``python -m pytest -q -s tests/e2e/test_vllm_scheduler_cluster.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster_helpers import NodeProcess, _wait, start_each, start_master
from scheduler_helpers import remote_fetched, with_metrics
from thread_helpers import wait_until
from vllm_helpers import MODEL, PYTHON, engine_stats, engine_steps, requires_vllm, wait_engine_file

from kvstored import Client, Namespace
from kvstored.client.master import MasterClient
from kvstored.demo.vllm_demo import EngineProcess, build_prompts, engine_spec
from kvstored.scheduler.ctl import describe_scheduler
from kvstored.v1 import scheduler_pb2 as pb
from kvstored.v1 import scheduler_pb2_grpc

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    requires_vllm,
]

PROMPT_TOKENS = 1024
ANSWER_TOKENS = 12
BLOCK_TOKENS = 128  # run_engine's block_size
NODE_DRAM = "256MiB"  # ~50 MiB of KV for the prompt (30 layers x 3 KV heads x 64 x fp32)
ENGINE_KV_BYTES = 256 << 20
ENGINE_ENV = {"VLLM_HOST_IP": "127.0.0.1"}  # else vLLM probes a route to 8.8.8.8 for its IP
ENGINE_WAIT_S = 400.0  # a hang guard on an engine's progress (it fails fast if it exits)
CONNECTOR = {"lookup_timeout_ms": 10_000, "timeout_ms": 60_000}  # a loaded 2-core machine


def _engine(prompts: list[list[int]], steps: list[dict[str, Any]], workdir: Path, *,
            node: NodeProcess | None, master: str = "", instance: str = "") -> EngineProcess:
    assert PYTHON is not None and MODEL is not None
    if node is None:
        spec = engine_spec(MODEL, prompts, steps, connector=None)
    else:
        spec = engine_spec(MODEL, prompts, steps, extra_config={
            **CONNECTOR, "address": node.unix_address, "stats_dir": str(workdir / "stats"),
            "scheduler_address": master, "scheduler_instance_id": instance})
    spec["kv_cache_memory_bytes"] = ENGINE_KV_BYTES
    spec["max_num_batched_tokens"] = 2048  # a smaller warm-up forward; the prompt is one chunk
    return EngineProcess(PYTHON, spec, workdir, env=ENGINE_ENV)


def _wait_file(path: Path, engine: EngineProcess) -> None:
    wait_engine_file(path, engine, ENGINE_WAIT_S)


def test_a_prefix_on_a_busy_node_is_copied_to_the_chosen_engine_before_its_prefill(
    workdir: Path, procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"scheduler e2e: {what} at {time.monotonic() - t0:.1f} s", flush=True)

    monkeypatch.setenv("KVSTORED_MASTER__SCHEDULER_BLOCK_TOKENS", str(BLOCK_TOKENS))
    master = start_master(workdir, procs)
    a = NodeProcess(workdir / "a", master.address, "a", dram_size=NODE_DRAM, ssd_size="0")
    b = with_metrics(NodeProcess(workdir / "b", master.address, "b", dram_size=NODE_DRAM,
                                 ssd_size="0"))
    start_each([a, b], procs)
    assert MODEL is not None
    _, prompts = build_prompts(MODEL, PROMPT_TOKENS, ("What does this document describe? "
                                                      "Answer in one sentence.",))
    a_done, a_exit, go = workdir / "a-done", workdir / "a-exit", workdir / "b-go"
    engine_a = _engine(prompts, [{"prompt": 0, "max_tokens": 1},
                                 {"signal_file": str(a_done), "wait_for_file": str(a_exit)}],
                       workdir / "engine-a", node=a, master=master.address, instance="A")
    procs.append(engine_a)
    engine_b = _engine(prompts, [{"wait_for_file": str(go), "wait_timeout_s": ENGINE_WAIT_S},
                                 {"prompt": 0, "max_tokens": ANSWER_TOKENS}],
                       workdir / "engine-b", node=b, master=master.address, instance="B")
    procs.append(engine_b)
    engine_r = _engine(prompts, [{"prompt": 0, "max_tokens": ANSWER_TOKENS}],
                       workdir / "engine-r", node=None)
    procs.append(engine_r)

    _wait_file(a_done, engine_a)
    mark("A stored the prompt")
    fields = engine_stats(workdir / "engine-a" / "stats", "worker")["extra"]["namespace"]
    namespace = Namespace(**fields)
    with Client(a.unix_address, namespace=namespace) as kv:
        blocks, truncated = kv.list_blocks(namespace.id)
    assert not truncated
    # a key is (layer: 2 bytes) + the block's hash (blockio.block_keys): block-major order
    a_keys = sorted((blk.key for blk in blocks), key=lambda k: (k[2:], k[:2]))
    num_layers = len({k[:2] for k in a_keys})
    shared_blocks = (len(prompts[0]) - 1) // BLOCK_TOKENS
    assert len(a_keys) == shared_blocks * num_layers, (len(a_keys), num_layers)
    with MasterClient(master.address) as m:
        def indexed_on_a() -> bool:
            got, complete = m.lookup_prefix(namespace.id, a_keys)
            return complete and len(got) == len(a_keys) and {r.node_id for r in got} == {"a"}
        _wait("A's blocks indexed on node a", indexed_on_a)

    def registered() -> bool:  # B registers while it starts, before it waits for `go`
        if engine_b.proc.poll() is not None:
            raise AssertionError(f"engine B exited:\n{engine_b.log_path.read_text()[-3000:]}")
        ids = {i["instance_id"] for i in describe_scheduler(master.address, 10)["instances"]}
        return {"A", "B", "A/decode", "B/decode"} <= ids
    wait_until(registered, ENGINE_WAIT_S, "both engines registered", interval_s=0.5)
    mark("both engines registered")
    assert remote_fetched(b) == 0

    with grpc.insecure_channel(master.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        stub.ReportLoad(pb.ReportLoadRequest(instance_id="A", queued_prefill_ms=60_000))
        t_copy = time.monotonic()
        d = stub.Schedule(pb.ScheduleRequest(
            request_id="q1", block_keys=a_keys, namespace_id=namespace.id,
            input_tokens=len(prompts[0]), expected_output_tokens=ANSWER_TOKENS,
            keys_per_block=num_layers, copy_wait_ms=60_000), timeout=90)
        copy_wall_s = time.monotonic() - t_copy
    assert d.admitted, d
    assert d.prefill_instance_id == "B" and d.prefix_node_id == "a", d
    assert len(d.replicate_block_keys) == len(a_keys)
    assert d.copy_state == pb.COPY_STATE_DONE, d
    assert d.copied_blocks == len(a_keys) and d.missing_blocks == 0, d
    assert remote_fetched(b) == len(a_keys)  # the prefix arrived on node b before B's prefill

    mark("the prefix copied to node b")
    go.write_text("go\n")
    b_steps = engine_steps(engine_b)
    mark("B answered")
    a_exit.write_text("go\n")
    reference = engine_steps(engine_r)
    engine_steps(engine_a)
    hit = b_steps[0]
    worker = engine_stats(workdir / "engine-b" / "stats", "worker")
    summary = {"prompt_tokens": hit["prompt_tokens"], "cached_tokens": hit["num_cached_tokens"],
               "blocks_copied": d.copied_blocks, "bytes_copied": d.copied_bytes,
               "copy_ms": d.copy_ms, "copy_wall_s": round(copy_wall_s, 3),
               "b_ttft_s": round(hit["wall_s"], 3), "b_blocks_loaded": worker["blocks_loaded"],
               "wall_s": round(time.monotonic() - t0, 1)}
    print("scheduler e2e: " + json.dumps(summary), flush=True)
    assert hit["num_cached_tokens"] == shared_blocks * BLOCK_TOKENS, summary
    assert worker["blocks_loaded"] >= shared_blocks, worker
    assert remote_fetched(b) == len(a_keys), "B's load fetched from a peer: the copy missed"
    assert hit["token_ids"] == reference[0]["token_ids"], (hit["text"], reference[0]["text"])
