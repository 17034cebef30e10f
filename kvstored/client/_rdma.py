"""An engine's reads of a REMOTE node over RDMA (docs/rdma.md): its DRAM hits by one-sided
READs checked by the node's slot headers, everything else over the TCP data plane.

Tried once per described node epoch, only when all of these hold, else the client reads over
TCP exactly as before (the reason logged once at debug):

- the client reaches the node at a TCP address (transport auto/tcp: the TCP data plane);
- the node's Describe lists ``rdma`` in ``transports``;
- the client acts for the shared tenant (an rkey reads every tenant's blocks);
- this process loads a verbs layer (pyverbs, or ``KVSTORED_TEST_VERBS`` in tests) with a
  device, and the node answers ConnectRdma (role ``node`` under TLS: an engine certificate is
  refused, so under TLS an engine reads over TCP).

The reads are :class:`kvstored.node.rdma_peers.PeerReads` (the node's own peer path, imported
lazily so a client that never meets an RDMA node loads none of it): the misses go over the
same DataPlaneClient (with ``GET_FLAG_FILL_FROM_PEERS``), and any RDMA error sends the whole
get over TCP and keeps this client on TCP (until the node is described again).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from kvstored.errors import KvstoredError, TransferFailed

if TYPE_CHECKING:
    from kvstored.client._state import ClientState
    from kvstored.client.types import NodeInfo
    from kvstored.transport.tcp import DataPlaneClient

log = structlog.get_logger(__name__)

_CLIENT_EPOCH = time.time_ns()  # this process: a restarted client's old QPs are ended
BOUNCE_MIN_BYTES = 16 << 20


@dataclass
class RdmaReads:
    """A client's RDMA path to one node: the reads, and what to close."""

    reads: Any  # kvstored.node.rdma_peers.PeerReads
    endpoint: Any
    close_session: Any
    counts: Any = field(default=None)

    def close(self) -> None:
        """Destroy the QP, end the node's session (best effort), free the endpoint."""
        self.reads.close()
        try:
            self.close_session()
        except KvstoredError:
            pass
        self.endpoint.close()


def open_rdma_reads(st: ClientState, info: NodeInfo, dp: DataPlaneClient) -> RdmaReads | None:
    """The RDMA path to the node described by ``info`` (see the module doc), or None.

    Never raises: every failure leaves the client on TCP (logged).
    """
    if "rdma" not in info.transports or st.tenant or st.is_unix:
        return None
    try:
        import grpc

        from kvstored.node.rdma_node import list_devices, load_verbs
        from kvstored.node.rdma_peers import PathCounts, PeerReads
        from kvstored.rpc_status import error_from_rpc
        from kvstored.security.tls import open_channel
        from kvstored.tiers.slots import Layout
        from kvstored.transport.rdma import RdmaAdvert, RdmaEndpoint, connect
        from kvstored.v1 import node_pb2 as pb
        from kvstored.v1 import node_pb2_grpc as node_grpc

        verbs = load_verbs()
        devices = list_devices(verbs) if verbs is not None else []
        if verbs is None or not devices:
            log.debug("client_rdma_unavailable", reason="no verbs layer or no device here")
            return None
        me = f"client-{socket.gethostname()}-{os.getpid()}"
        got: list[Any] = []

        def call(method: str, req: Any) -> Any:
            channel = open_channel(st.target, st.tls)
            try:
                return getattr(node_grpc.NodeServiceStub(channel), method)(req, timeout=2.0)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
            finally:
                channel.close()

        def exchange(local: bytes) -> bytes:
            r = call("ConnectRdma", pb.ConnectRdmaRequest(advert=local, node_id=me,
                                                          epoch=_CLIENT_EPOCH))
            got.append(r)
            if verbs.attach_peer is not None:
                verbs.attach_peer(RdmaAdvert.from_json(bytes(r.advert)), r.arena_path)
            return bytes(r.advert)

        endpoint = RdmaEndpoint(verbs, devices[0], bytearray(max(BOUNCE_MIN_BYTES, info.max_block_bytes)),
                                remote_access=False)
        try:
            rdma = connect(endpoint, exchange)
            lay = Layout(got[0].arena_size_bytes)
            if lay.total_bytes != rdma.peer.length_bytes:
                rdma.close()
                raise TransferFailed(f"the node registered {rdma.peer.length_bytes} bytes, its "
                                    f"arena file is {lay.total_bytes}")
        except BaseException:
            if got:
                try:
                    call("DisconnectRdma", pb.DisconnectRdmaRequest(session_id=got[0].session_id))
                except KvstoredError:
                    pass
            endpoint.close()
            raise
    except (KvstoredError, OSError, ValueError) as exc:
        log.info("client_rdma_not_used", address=st.address, reason=str(exc))
        return None
    except Exception as exc:  # a verbs layer's own error (PyverbsError): TCP
        log.info("client_rdma_not_used", address=st.address, reason=f"{type(exc).__name__}: {exc}")
        return None
    counts = PathCounts()
    sid = got[0].session_id
    log.info("client_rdma_reads", address=st.address, session_id=sid, device=devices[0])
    return RdmaReads(PeerReads(dp, rdma, lay, counts), endpoint,
                     lambda: call("DisconnectRdma", pb.DisconnectRdmaRequest(session_id=sid)),
                     counts)
