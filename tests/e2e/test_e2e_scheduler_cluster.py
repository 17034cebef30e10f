"""The scheduler on a real cluster: ``kvstored master`` hosts it, two real nodes, no engine.

Blocks put through node a are the prefix; instance A (prefill, node a) reports a long
queue, instance B (prefill, node b) an idle one. Schedule names B, with node a as the
prefix's holder (read from the master's index) and the prefix's keys to replicate; the
master has node b copy them in (NodeService.Prefetch: the cluster get path) and answers
DONE once they are there. Node b's counters show the blocks arrived from a peer, and a read
through node b afterwards is a local hit with the same bytes (its remote counter does not
move). The vLLM version of this scenario is tests/e2e/test_vllm_scheduler_cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster_helpers import NodeProcess, _indexed, _keys, _put, _wait, start_each, start_master
from e2e_helpers import ServeProcess, value_for
from scheduler_helpers import remote_fetched, with_metrics

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.scheduler.ctl import register_engine
from kvstored.v1 import node_pb2, scheduler_pb2_grpc
from kvstored.v1 import scheduler_pb2 as pb


def test_the_scheduler_places_a_prefill_off_a_busy_holder_and_copies_the_prefix_first(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs)
    a = NodeProcess(workdir / "a", master.address, "a", dram_size="16MiB")
    b = with_metrics(NodeProcess(workdir / "b", master.address, "b", dram_size="16MiB"))
    start_each([a, b], procs)
    keys = _keys(12)
    _put(a, keys)
    with MasterClient(master.address) as m:
        _wait("the prefix indexed on a", lambda: _indexed(m, keys, "a"))
    register_engine(master.address, "A", "a", ["prefill", "decode"], timeout_s=10)
    register_engine(master.address, "B", "b", ["prefill", "decode"], timeout_s=10)
    assert remote_fetched(b) == 0
    with grpc.insecure_channel(master.address) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        stub.ReportLoad(pb.ReportLoadRequest(instance_id="A", queued_prefill_ms=60_000))
        resp = stub.Schedule(pb.ScheduleRequest(
            request_id="r1", block_keys=keys, input_tokens=12 * 256 + 100,
            copy_wait_ms=30_000), timeout=60)
    assert resp.admitted, resp
    assert resp.prefill_instance_id == "B" and resp.prefix_node_id == "a", resp
    assert list(resp.replicate_block_keys) == keys
    assert resp.copy_state == pb.COPY_STATE_DONE, resp
    assert resp.copied_blocks == 12 and resp.missing_blocks == 0
    assert resp.copied_bytes == sum(len(value_for(k)) for k in keys)
    assert remote_fetched(b) == 12  # they arrived from a peer, before any read of b
    with Client(b.unix_address) as c:
        assert {blk.key for blk in c.list_blocks()[0]} == set(keys)
        assert c.get(keys) == [value_for(k) for k in keys]
    assert remote_fetched(b) == 12  # the read hit b's own copies


def test_prefetch_on_a_node_without_a_master_copies_nothing_and_says_what_is_missing(
    workdir: Path, procs: list[Any]
) -> None:
    node = ServeProcess(workdir, node_id="alone")
    procs.append(node)
    node.start()
    keys = _keys(3)
    with Client(node.unix_address) as c:
        c.put(keys[:1], [value_for(keys[0])])
    with grpc.insecure_channel(node.tcp_address) as ch:
        call = ch.unary_unary("/kvstored.v1.NodeService/Prefetch",
                              request_serializer=node_pb2.PrefetchRequest.SerializeToString,
                              response_deserializer=node_pb2.PrefetchResponse.FromString)
        resp = call(node_pb2.PrefetchRequest(keys=keys), timeout=10)
        assert (resp.num_present, resp.num_fetched, resp.num_missing) == (1, 0, 2)
        with pytest.raises(grpc.RpcError) as e:
            call(node_pb2.PrefetchRequest(keys=[b""]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
