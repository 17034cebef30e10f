"""Every ErrorCode round-trips: exception -> gRPC status + trailing metadata -> exception.

Checked twice: against a stand-in RpcError (the mapping tables alone) and through a real
grpc.aio server running the node's servicer wrapper (kvstored.node.service) and a real
channel, which is how clients see errors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from kvstored import errors
from kvstored.config import NodeConfig
from kvstored.errors import ErrorCode, KvstoredError
from kvstored.node.service import NodeServicer, add_node_service
from kvstored.rpc_status import (
    ERROR_CODE_METADATA_KEY,
    error_from_rpc,
    grpc_status,
    grpc_trailing_metadata,
    no_answer_error,
)
from kvstored.v1 import node_pb2 as pb

CODES = [c for c in ErrorCode if c != ErrorCode.OK]


class _FakeRpcError(grpc.RpcError):
    def __init__(self, status: grpc.StatusCode, details: str, trailing: Any) -> None:
        self._status, self._details, self._trailing = status, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


def test_every_code_has_exactly_one_class() -> None:
    for code in CODES:
        cls = errors.error_class(code)
        assert cls.code == code, f"{code.name} maps to {cls.__name__} whose code is {cls.code.name}"
        assert issubclass(cls, KvstoredError)
    assert errors.error_class(99999) is errors.InternalError


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_round_trip_through_status_and_metadata(code: ErrorCode) -> None:
    cls = errors.error_class(code)
    original = cls(f"something about {code.name} went wrong")
    rpc_error = _FakeRpcError(grpc_status(original), str(original), grpc_trailing_metadata(original))
    back = error_from_rpc(rpc_error)
    assert type(back) is cls
    assert str(back) == str(original)
    assert back.retriable == original.retriable


def test_status_without_metadata_falls_back_to_the_grpc_status() -> None:
    back = error_from_rpc(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused", None))
    assert isinstance(back, errors.Unavailable) and back.retriable
    back = error_from_rpc(_FakeRpcError(grpc.StatusCode.UNKNOWN, "boom", ()))
    assert isinstance(back, errors.InternalError)
    garbage = ((ERROR_CODE_METADATA_KEY, "not-a-number"),)
    back = error_from_rpc(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow", garbage))
    assert isinstance(back, errors.DeadlineExceeded)


# ---- through a real server -------------------------------------------------------------------


class _RaisingCore:
    """Stands in for NodeCore: ``stats()`` raises whatever ``self.error`` is."""

    metrics = None
    cfg = NodeConfig(node_id="errors", ssd_size_bytes=0)
    rpcs_in_flight = 0

    def __init__(self) -> None:
        self.error: BaseException = RuntimeError("unset")

    def stats(self) -> Any:
        raise self.error


class _Server:
    def __init__(self) -> None:
        self.core = _RaisingCore()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        server = grpc.aio.server()
        with ThreadPoolExecutor(2) as pool:
            add_node_service(server, NodeServicer(self.core, pool, version="test"))  # type: ignore[arg-type]
            self.port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self.ready.set()
            await self.stop_event.wait()
            await server.stop(grace=0)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    s = _Server()
    s.thread.start()
    assert s.ready.wait(10), "test gRPC server did not start"
    yield s
    s.stop()


@pytest.fixture(scope="module")
def channel(server: _Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


def _stats_call(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        "/kvstored.v1.NodeService/Stats",
        request_serializer=pb.StatsRequest.SerializeToString,
        response_deserializer=pb.StatsResponse.FromString,
    )


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_round_trip_through_a_real_server(server: _Server, channel: grpc.Channel, code: ErrorCode) -> None:
    cls = errors.error_class(code)
    server.core.error = cls(f"server says {code.name}")
    with pytest.raises(grpc.RpcError) as info:
        _stats_call(channel)(pb.StatsRequest(), timeout=5)
    assert info.value.code() == grpc_status(cls(""))
    back = error_from_rpc(info.value)
    assert type(back) is cls
    assert str(back) == f"server says {code.name}"


def test_unexpected_exception_becomes_internal(server: _Server, channel: grpc.Channel) -> None:
    server.core.error = ZeroDivisionError("division by zero")
    with pytest.raises(grpc.RpcError) as info:
        _stats_call(channel)(pb.StatsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    back = error_from_rpc(info.value)
    assert isinstance(back, errors.InternalError)
    assert "division" not in str(back)  # internals stay in the server log
    assert "Stats" in str(back)


def test_garbage_request_is_invalid_argument(server: _Server, channel: grpc.Channel) -> None:
    raw = channel.unary_unary("/kvstored.v1.NodeService/Stats")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\xff\xff\xff", timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    back = error_from_rpc(info.value)
    assert type(back) is errors.InvalidArgument
    assert "StatsRequest" in str(back)


def test_a_call_nobody_answered_is_unavailable_naming_the_server_and_the_time() -> None:
    # a SIGSTOPped master: gRPC's own deadline, no kvstored code (fail17b, issue 17 item 3)
    late = no_answer_error(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded",
                                         None), "master at 127.0.0.1:7080", "ListNodes", 0.5)
    assert isinstance(late, errors.Unavailable)
    assert str(late).startswith("master at 127.0.0.1:7080 did not answer ListNodes within "
                                "500 ms (the process may be stopped")
    # the server's own DeadlineExceeded (it carries kvstored's code) and other failures stay
    own = ((ERROR_CODE_METADATA_KEY, str(int(errors.ErrorCode.DEADLINE_EXCEEDED))),)
    assert no_answer_error(_FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow", own),
                           "master at x:1", "ListNodes", 0.5) is None
    assert no_answer_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "refused", None),
                           "master at x:1", "ListNodes", 0.5) is None
