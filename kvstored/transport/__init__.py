"""Data-plane transports: base.py (the ports: Transport, BlockServer, the one-sided shapes),
framing.py (frame codec, limits, deadline-bounded socket I/O), tcp.py (client),
tcp_server.py (server), control.py, master_rpc.py (the master's gRPC stub wrapper, shared by
the node and the client). Imports nothing from kvstored.node or kvstored.tiers."""
