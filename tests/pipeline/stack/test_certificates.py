"""The object store's certificates (pipeline/stack/certificates.py): one set made at the first
start, private, naming the stack's address; kept while it names it, made anew (a new authority)
for another address, since SeaweedFS's HTTPS client checks the address it dials."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509

from pipeline.stack.certificates import ensure_certificates, names_addresses, tls_files

pytestmark = pytest.mark.fast


def authority(directory) -> bytes:
    return tls_files(directory).ca.read_bytes()


def test_made_once_private_and_naming_the_stacks_address(tmp_path):
    files = ensure_certificates(tmp_path / "tls", "10.0.0.1")
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    for path in (files.ca, files.cert, files.key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    named = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(map(str, named.get_values_for_type(x509.IPAddress))) == ["10.0.0.1", "127.0.0.1"]
    issuer = x509.load_pem_x509_certificate(files.ca.read_bytes())
    cert.verify_directly_issued_by(issuer)
    before = authority(tmp_path / "tls")
    ensure_certificates(tmp_path / "tls", "127.0.0.1")   # 127.0.0.1 is named: kept
    assert authority(tmp_path / "tls") == before


def test_a_certificate_for_another_address_is_made_anew(tmp_path):
    files = ensure_certificates(tmp_path / "tls", "127.0.0.1")
    before = authority(tmp_path / "tls")
    assert not names_addresses(files.cert, "10.0.0.2")
    ensure_certificates(tmp_path / "tls", "10.0.0.2")
    assert authority(tmp_path / "tls") != before and names_addresses(files.cert, "10.0.0.2")
    x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(files.ca.read_bytes()))
