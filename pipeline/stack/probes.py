"""Anonymous probes of a gRPC port: does it serve HTTP/2 (gRPC's transport) to a caller without the
stack's client certificate? SeaweedFS falls back to plain gRPC, with a warning in its log only, when
it cannot load its certificates, so the stack checks after every start that it did not (and the
tests use the same probe on every port)."""

from __future__ import annotations

import socket
import ssl

# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first. A server
# that speaks HTTP/2 answers with a SETTINGS frame of its own (frame type 4, the 4th byte).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_FRAME_TYPE = 4


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
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE   # the probe judges the server's demands, not its certificate
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                if _answers_http2(tls):
                    return "HTTP/2 over TLS without a client certificate"
        except (ssl.SSLError, OSError):
            return None   # the handshake failed, or the server alerted "certificate required"
    return None
