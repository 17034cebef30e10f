"""Data-plane transports. Imports nothing from kvstored.node or kvstored.tiers: a node
serves through the :class:`~kvstored.transport.base.BlockServer` port it implements.

- ``base.py``: the ports: Transport (two-sided), the one-sided shapes, BlockServer.
- ``control.py``: framing of the lean control channel (node/control.py, client/_control.py).
- ``framing.py``: the TCP data plane's frame codec, limits and deadline-bounded socket I/O
  (docs/architecture.md#data-plane).
- ``listen.py``: binding a gRPC server's listen addresses, one clean error per unusable one.
- ``master_rpc.py``: MasterClient, the master's gRPC stub wrapper shared by node and client.
- ``tcp.py``: the TCP data-plane client (a pool of blocking sockets) and the protocol's rules.
- ``tcp_server.py``: the TCP data-plane server (DataPlaneServer).
- ``tcp_streams.py``: several TCP streams for one large GET (split policy, abort registry).
"""
