"""The node daemon: gRPC adapter (service.py), request core (core.py), lifecycle (daemon.py)."""
