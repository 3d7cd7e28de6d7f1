"""Anonymous probes of the object store's internal ports: does a gRPC port serve HTTP/2 (gRPC's
transport), or an HTTP port serve HTTP, to a caller without the stack's client certificate?
SeaweedFS falls back to plain gRPC, with a warning in its log only, when it cannot load its
certificates, so the stack checks after every start that it did not (and the tests use the same
probes on every port)."""

from __future__ import annotations

import socket
import ssl

# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first. A server
# that speaks HTTP/2 answers with a SETTINGS frame of its own (frame type 4, the 4th byte).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_FRAME_TYPE = 4
REQUEST = b"GET /healthz HTTP/1.0\r\nHost: probe\r\n\r\n"
# What Go's HTTPS server answers a plain HTTP request with, before any handler sees it.
PLAIN_TO_HTTPS = b"Client sent an HTTP request to an HTTPS server"


def _anonymous_tls(alpn: list[str]) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE   # the probe judges the server's demands, not its certificate
    context.set_alpn_protocols(alpn)
    return context


def _read(sock: socket.socket, limit: int = 4096) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = sock.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _answers_http2(sock: socket.socket) -> bool:
    sock.sendall(PREFACE)
    try:
        data = sock.recv(64)
    except (OSError, TimeoutError):
        return False
    return len(data) >= 4 and data[3] == SETTINGS_FRAME_TYPE


def http2_without_certificate(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """How ``host:port`` serves HTTP/2 to a caller without a client certificate (plain, or over
    TLS), or None when it does not."""
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        if _answers_http2(raw):
            return "plain HTTP/2 (gRPC without TLS)"
    context = _anonymous_tls(["h2"])
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                if _answers_http2(tls):
                    return "HTTP/2 over TLS without a client certificate"
        except (ssl.SSLError, OSError):
            return None   # the handshake failed, or the server alerted "certificate required"
    return None


def plain_http_answer(host: str, port: int, timeout_s: float = 5.0) -> bytes:
    """What ``host:port`` answers a plain HTTP request (``GET /healthz``) with."""
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        raw.sendall(REQUEST)
        try:
            return _read(raw)
        except (OSError, TimeoutError):
            return b""


def https_without_certificate(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """How ``host:port`` serves HTTP to a caller without a client certificate (plain, or over TLS),
    or None when it answers plain HTTP only with Go's "HTTP request to an HTTPS server" and refuses
    the TLS handshake without a certificate."""
    answer = plain_http_answer(host, port, timeout_s)
    if answer and PLAIN_TO_HTTPS not in answer:
        status_line = answer.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"plain HTTP ({status_line})"
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        try:
            with _anonymous_tls(["http/1.1"]).wrap_socket(raw) as tls:
                tls.sendall(REQUEST)
                answer = _read(tls)
        except (ssl.SSLError, OSError):
            return None   # the handshake failed, or the server alerted "certificate required"
    return f"HTTPS without a client certificate ({answer[:40]!r})" if answer else None
