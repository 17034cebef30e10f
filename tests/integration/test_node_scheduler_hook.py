"""The daemon's scheduler hook: the real SchedulerService on the node's gRPC server, reading the
node's own store through its block locator and exporting on the node's /metrics."""

from __future__ import annotations

import urllib.request
from typing import Any

import grpc
import pytest
from it_helpers import random_keys
from prometheus_client.parser import text_string_to_metric_families

from kvstored import Client
from kvstored.v1 import scheduler_pb2 as pb
from kvstored.v1 import scheduler_pb2_grpc


def _register(stub: scheduler_pb2_grpc.SchedulerServiceStub, node_id: str) -> None:
    for iid, role in (("p", pb.INSTANCE_ROLE_PREFILL), ("d", pb.INSTANCE_ROLE_DECODE)):
        stub.RegisterInstance(pb.RegisterInstanceRequest(
            instance=pb.InstanceInfo(instance_id=iid, node_id=node_id, role=role)), timeout=10)


def _scrape(address: str) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(body) for s in fam.samples
            if not s.labels}


def test_hook_serves_the_real_scheduler_over_the_nodes_store(start_node: Any) -> None:
    node = start_node(enable_scheduler=True)
    keys = random_keys(6)
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys[:4], [b"a", b"b", b"c", b"d"]))
    with grpc.insecure_channel(node.tcp_address) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        _register(stub, node.cfg.node_id)
        first = stub.Schedule(pb.ScheduleRequest(request_id="r1", block_keys=keys,
                                                 input_tokens=2000), timeout=10)
        assert first.admitted and (first.local_blocks, first.num_blocks) == (4, 6)
        # the locator reads the store live: a removed block cuts the leading run at 1
        with Client(node.unix_address) as c:
            assert c.remove([keys[1]]) == [True]
        second = stub.Schedule(pb.ScheduleRequest(request_id="r2", block_keys=keys,
                                                  input_tokens=2000), timeout=10)
        assert second.admitted and second.local_blocks == 1
    # the scheduler's metrics live on the node's registry, so on its /metrics
    assert _scrape(node.daemon.metrics_address)["kvstored_scheduler_admissions_total"] == 2


def test_scheduler_is_not_hosted_unless_enabled(start_node: Any) -> None:
    node = start_node(enable_scheduler=False)
    with grpc.insecure_channel(node.tcp_address) as ch:
        with pytest.raises(grpc.RpcError) as info:
            scheduler_pb2_grpc.SchedulerServiceStub(ch).DescribeScheduler(
                pb.DescribeSchedulerRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    assert "kvstored_scheduler_admissions_total" not in _scrape(node.daemon.metrics_address)
