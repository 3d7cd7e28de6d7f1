"""The object store's certificates: SeaweedFS's master, volume, filer, S3 and admin servers talk
gRPC to each other, and HTTP for the data itself (the S3 gateway reads and writes chunks on the
volume server); each port would take any caller's request (list, read, write, delete every file;
assign volumes; show the cluster's topology and disks) unless mutual TLS is on (its security.toml
``[grpc]`` and ``[https]`` sections). Here a certificate authority of the stack's own signs one
certificate (server and client use: the store's components share it, as SeaweedFS allows) and is
then forgotten: its key is never written, so no further certificate can be made, and a caller
without ``weed.key`` gets no answer but a refused handshake.

The certificate names the addresses the parts reach each other on (the stack's host and
127.0.0.1): SeaweedFS's HTTPS client checks them. A certificate without the current host (made
for another ``STACK_HOST``, or before HTTPS was on) is made anew with a new authority.

The files lie in ``<dir>/secrets/weed-tls/`` (0700; the key 0600), made at the first start."""

from __future__ import annotations

import datetime
import ipaddress
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


def addresses(host: str) -> list[str]:
    """The IP addresses the certificate names: the stack's host, and 127.0.0.1 (weed's local listeners)."""
    return sorted({host, "127.0.0.1"})


def names_addresses(cert_file: Path, host: str) -> bool:
    """Whether the certificate in ``cert_file`` names every address of ``addresses(host)``."""
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        named = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    found = {str(ip) for ip in named.get_values_for_type(x509.IPAddress)}
    return set(addresses(host)) <= found


def ensure_certificates(directory: Path, host: str) -> TlsFiles:
    """The CA certificate, the store's certificate (naming ``host``) and its key in ``directory``,
    made if missing or if the certificate does not name ``host``."""
    files = tls_files(directory)
    if all(p.is_file() for p in (files.ca, files.cert, files.key)) and names_addresses(files.cert, host):
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
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a))
                                                        for a in addresses(host)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files.ca.unlink(missing_ok=True)   # a set being replaced is incomplete until the new CA is written
    write_private(files.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()).decode())
    write_private(files.cert, cert.public_bytes(pem).decode())
    write_private(files.ca, ca.public_bytes(pem).decode())   # last: its presence says the set is complete
    return files
