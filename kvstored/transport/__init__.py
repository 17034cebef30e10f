"""Data-plane transports: base.py (the ports: Transport, BlockServer, the one-sided shapes),
framing.py (frame codec, limits, deadline-bounded socket I/O), tcp.py (client),
tcp_server.py (server), control.py. Imports nothing from kvstored.node or kvstored.tiers."""
