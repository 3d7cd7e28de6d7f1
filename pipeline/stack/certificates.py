"""The object store's gRPC certificates: SeaweedFS's master, volume, filer, S3 and admin servers
talk gRPC to each other, and their gRPC ports would take any caller's request (list, read, write,
delete every file; assign volumes) unless mutual TLS is on (its security.toml ``[grpc]`` sections).
Here a certificate authority of the stack's own signs one certificate (server and client use: the
store's components share it, as SeaweedFS allows) and is then forgotten: its key is never written,
so no further certificate can be made, and a caller without ``weed.key`` gets no gRPC answer.

The files lie in ``<dir>/secrets/weed-tls/`` (0700; the key 0600), made at the first start."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from pipeline.stack.secrets import write_private

COMMON_NAME = "translator-stack-weed"   # the only client name the servers accept (allowed_commonNames)
VALID_DAYS = 3650


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def tls_files(directory: Path) -> TlsFiles:
    return TlsFiles(directory / "ca.crt", directory / "weed.crt", directory / "weed.key")


def ensure_certificates(directory: Path) -> TlsFiles:
    """The CA certificate, the store's certificate and its key in ``directory``, made if missing."""
    files = tls_files(directory)
    if all(p.is_file() for p in (files.ca, files.cert, files.key)):
        return files
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def builder(subject: str, issuer: str, public_key) -> x509.CertificateBuilder:  # noqa: ANN001 - an EC key
        return (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = f"{COMMON_NAME} CA"
    ca = (builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (builder(COMMON_NAME, ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    write_private(files.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()).decode())
    write_private(files.cert, cert.public_bytes(pem).decode())
    write_private(files.ca, ca.public_bytes(pem).decode())   # last: its presence says the set is complete
    return files
