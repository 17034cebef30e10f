"""Data-plane transports: base.py (the Transport interface), framing.py (frame codec, limits,
deadline-bounded socket I/O), tcp.py (client; re-exports the server), tcp_server.py (server)."""
