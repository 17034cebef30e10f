"""Data-plane transports (tcp.py: framed, batched TCP for bulk block bytes)."""
