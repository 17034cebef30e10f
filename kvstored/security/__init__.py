"""Mutual TLS and who a peer is (docs/security.md).

- :mod:`.tls`: :class:`~.tls.TlsFiles` (the ``[tls]`` files, read and checked once), gRPC
  server and channel credentials (grpcio's own), ``ssl.SSLContext`` s for the TCP data plane,
  and the one function per side that opens a gRPC channel or binds a listener.
- :mod:`.identity`: a verified peer certificate -> :class:`kvstored.auth.Principal` (roles and
  tenant from SAN URIs ``kvstored://role/R`` and ``kvstored://tenant/T``), for gRPC contexts
  and data-plane sockets alike.
- :mod:`.certs`: a small CA and certificates for a test cluster (``kvstored certs init``).

Layer: beside transport/ (imports only the leaves, ``kvstored.auth``, grpc, ssl and
cryptography); transport/, node/, master/ and client/ import it.
"""
