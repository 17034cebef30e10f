"""The ``[tls]`` files and everything built from them: gRPC credentials, data-plane contexts,
and the one function per side that opens a gRPC channel or binds a gRPC listener.

Only well-kept libraries do the cryptography: grpcio's ``ssl_server_credentials`` (with
``require_client_auth=True``) and ``ssl_channel_credentials`` for gRPC, Python's ``ssl``
module (``CERT_REQUIRED`` on both ends, hostname checked by the client) for the TCP data
plane. A unix-socket address never gets TLS: its callers are local processes, judged by the
socket's file mode (docs/security.md).

Where TLS comes from: a daemon's ``[tls]`` section (``KVSTORED_TLS__CERT_FILE`` ... in the
environment also set it, through the one config loader); an engine's
``Client(tls=TlsFiles.load(...))``, else the same three env vars (:func:`tls_from_env`);
kvstorectl's ``--tls-cert/--tls-key/--tls-ca`` or ``--config FILE`` (its ``[tls]``).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from kvstored.errors import ConfigInvalid

if TYPE_CHECKING:
    from kvstored.config import TlsConfig

ENV_CERT = "KVSTORED_TLS__CERT_FILE"
ENV_KEY = "KVSTORED_TLS__KEY_FILE"
ENV_CA = "KVSTORED_TLS__CA_FILE"
HANDSHAKE_TIMEOUT_S = 5.0
"""Most seconds a data-plane TLS handshake may take (either end)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The three PEM files of one process, read and checked once.

    Attributes:
        cert_file, key_file, ca_file: the paths (for errors and for ``ssl``).
        cert_pem, key_pem, ca_pem: their contents.
    """

    cert_file: str
    key_file: str
    ca_file: str
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @classmethod
    def load(cls, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str],
             ca_file: str | os.PathLike[str], *, source: str = "tls") -> TlsFiles:
        """Read the files and check that the key matches the certificate and the CA parses.

        Args:
            source: how errors name the setting (``"tls"``, ``"--tls-cert/--tls-key/--tls-ca"``).

        Raises:
            ConfigInvalid: a file cannot be read, is not PEM, or the key does not match the
                certificate; the message names the file and ``source``.
        """
        paths = {"cert_file": os.fspath(cert_file), "key_file": os.fspath(key_file),
                 "ca_file": os.fspath(ca_file)}
        data: dict[str, bytes] = {}
        for what, path in paths.items():
            try:
                with open(path, "rb") as fh:
                    data[what] = fh.read()
            except OSError as exc:
                raise ConfigInvalid(f"cannot read {source} {what} {path}: {exc.strerror}") from None
            if b"-----BEGIN " not in data[what]:
                raise ConfigInvalid(f"{source} {what} {path} is not a PEM file (no -----BEGIN line)")
        try:
            ssl.create_default_context(cadata=data["ca_file"].decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigInvalid(f"{source} ca_file {paths['ca_file']} holds no usable CA certificate: {exc}") from None
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(paths["cert_file"], paths["key_file"])
        except ssl.SSLError as exc:
            raise ConfigInvalid(
                f"{source} cert_file {paths['cert_file']} and key_file {paths['key_file']} do not "
                f"load as a pair (not a certificate and its private key?): {exc.reason or exc}"
            ) from None
        return cls(paths["cert_file"], paths["key_file"], paths["ca_file"],
                   data["cert_file"], data["key_file"], data["ca_file"])

    @classmethod
    def from_config(cls, cfg: TlsConfig | None) -> TlsFiles | None:
        """The files of a ``[tls]`` section, or None when it is not configured.

        Raises:
            ConfigInvalid: as :meth:`load`.
        """
        if cfg is None or cfg.cert_file is None or cfg.key_file is None or cfg.ca_file is None:
            return None
        return cls.load(cfg.cert_file, cfg.key_file, cfg.ca_file, source="tls")

    # ---- gRPC --------------------------------------------------------------------------
    def server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that require a client certificate signed by the CA."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem,
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials: verify the server against the CA, present our cert."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    # ---- data plane (ssl) --------------------------------------------------------------
    def server_context(self) -> ssl.SSLContext:
        """A data-plane server context: CERT_REQUIRED (a peer without a CA-signed cert is
        refused in the handshake), TLS 1.2 at least."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.load_verify_locations(cadata=self.ca_pem.decode("ascii", "replace"))
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A data-plane client context: the server's cert must chain to the CA and name the
        host dialled (CERT_REQUIRED, check_hostname); presents our cert."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED + check_hostname
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.load_verify_locations(cadata=self.ca_pem.decode("ascii", "replace"))
        return ctx


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """The files named by ``KVSTORED_TLS__CERT_FILE``, ``..._KEY_FILE`` and ``..._CA_FILE``
    (what an engine's client uses when given no ``tls=``); None when none is set.

    Raises:
        ConfigInvalid: only some of the three are set, or as :meth:`TlsFiles.load`.
    """
    env = os.environ if environ is None else environ
    values = {name: env.get(name, "") for name in (ENV_CERT, ENV_KEY, ENV_CA)}
    if not any(values.values()):
        return None
    missing = [name for name, v in values.items() if not v]
    if missing:
        raise ConfigInvalid(f"TLS from the environment needs all three of {ENV_CERT}, {ENV_KEY}, "
                            f"{ENV_CA}; missing {', '.join(missing)}")
    return TlsFiles.load(values[ENV_CERT], values[ENV_KEY], values[ENV_CA], source="env KVSTORED_TLS__*")


def is_unix_target(target: str) -> bool:
    """Whether a gRPC address is a unix socket (``unix:PATH``, ``unix-abstract:NAME``)."""
    return target.startswith(("unix:", "unix-abstract:"))


def open_channel(target: str, tls: TlsFiles | None, *,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """The one way kvstored opens a blocking gRPC channel: TLS to a TCP ``target`` when
    ``tls`` is given, plaintext to a unix socket or without TLS."""
    if tls is None or is_unix_target(target):
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.channel_credentials(), options=list(options))


def open_aio_channel(target: str, tls: TlsFiles | None, *,
                     options: Sequence[tuple[str, Any]] = (),
                     interceptors: Sequence[Any] | None = None) -> grpc.aio.Channel:
    """:func:`open_channel` for ``grpc.aio`` (the node's link to the master, AsyncClient);
    ``interceptors`` as grpc.aio's (the client's tenant declaration)."""
    if tls is None or is_unix_target(target):
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(target, tls.channel_credentials(), options=list(options),
                                   interceptors=interceptors)


def port_credentials(address: str, tls: TlsFiles | None) -> grpc.ServerCredentials | None:
    """The credentials a gRPC listen address gets: None (plaintext) for a unix socket or
    without TLS, else mTLS server credentials (a client certificate is required)."""
    if tls is None or is_unix_target(address):
        return None
    return tls.server_credentials()
