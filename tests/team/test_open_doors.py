"""No open door: every socket that the stack's process trees listen on (found from the recorded
PIDs, not from a list) is asked, without credentials, to list, read, write, delete or assign, and
for its status, topology, disks and metrics, and answers nothing but a refusal. Allowed without
credentials (each named below, with what its body may hold): health endpoints, the MLflow and
Prefect UIs' static files (Prefect's API schema among them: the same in every install), and
PostgreSQL's authentication refusal. docs/team.md has the same table."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import stat
import uuid

import boto3
import psutil
import pytest

from pipeline.stack.certificates import tls_files
from pipeline.stack.groups import read_record
from pipeline.stack.probes import PLAIN_TO_HTTPS, http2_without_certificate, https_without_certificate
from pipeline.stack.settings import PORT_OFFSETS

from .conftest import Stack

pytestmark = pytest.mark.service

SERVICES = ("postgres", "s3", "mlflow", "prefect")
GRPC = {"weed.master.grpc", "weed.volume.grpc", "weed.filer.grpc", "weed.s3.grpc"}
WEED_HTTP = {"weed.master", "weed.volume", "weed.filer"}
FILE_ID = "1,01637037d6"   # a volume file id: volume 1 exists as soon as anything was written
# What a stranger asks SeaweedFS's own HTTP ports: data (list, read, write, delete, assign, the
# filer's chunk proxy) and metadata (status pages, topology, disks, metrics, the UIs).
WEED_REQUESTS = [("GET", p) for p in (
    "/", "/ui/index.html", "/metrics", "/status", "/healthz", "/health", "/cluster/status", "/cluster/healthz",
    "/dir/status", "/dir/assign", "/dir/lookup?volumeId=1", "/vol/status", "/vol/grow?count=1",
    "/col/delete?collection=none-such", "/stats/counter", "/stats/memory", "/stats/disk", "/buckets/",
    "/buckets/dvc/", "/?proxyChunkId=" + FILE_ID, "/" + FILE_ID, "/api/cluster/topology", "/api/s3/buckets",
    "/api/plugin/status", "/debug/pprof/")] + [("POST", "/dir/assign"), ("DELETE", "/" + FILE_ID)]
MLFLOW_CLOSED = [("GET", p) for p in (
    "/", "/version", "/server-info", "/metrics", "/signup", "/graphql",
    "/api/2.0/mlflow/experiments/search?max_results=1", "/api/2.0/mlflow-artifacts/artifacts",
    "/ajax-api/2.0/mlflow/registered-models/search",
    "/api/2.0/mlflow/users/get?username=admin")] + [
    ("POST", "/api/2.0/mlflow/runs/create", b"{}"),
    ("POST", "/api/2.0/mlflow/users/create", b'{"username": "stranger", "password": "stranger-pass-1"}',
     {"Content-Type": "application/json"})]
PREFECT_CLOSED = [("POST", f"/api/{kind}/filter", b"{}") for kind in (
    "flows", "flow_runs", "deployments", "work_pools", "variables", "block_documents", "logs", "artifacts",
    "automations", "events")] + [("GET", p) for p in (
        "/api/admin/settings", "/api/admin/version", "/api/version", "/api/hello", "/api/ui-settings",
        "/api/openapi.json")]
# Anonymous answers allowed, with a check of the body: nothing of the team's in them.
MLFLOW_OPEN = {"/health": lambda body: body == b"OK",
               "/static-files/index.html": lambda body: body.lstrip().lower().startswith(b"<!doctype html>")}
PREFECT_OPEN = {"/api/health": lambda body: body == b"true",
                "/api/ready": lambda body: json.loads(body) == {"message": "OK"},
                "/": lambda body: body.lstrip().lower().startswith(b"<!doctype html>"),
                "/docs": lambda body: b"swagger" in body.lower(),
                "/openapi.json": lambda body: json.loads(body)["info"]["title"] == "Prefect REST API",
                "/ui-settings": lambda body: json.loads(body)["auth"] == "BASIC"}


def process_trees(stack: Stack) -> dict[str, list[psutil.Process]]:
    trees = {}
    for name in SERVICES:
        record = read_record(stack.directory / "run" / f"{name}.pid")
        assert record is not None, name
        leader = psutil.Process(record.pid)
        trees[name] = [leader, *leader.children(recursive=True)]
    return trees


def listening(trees: dict[str, list[psutil.Process]]) -> dict[tuple[str, int], str]:
    """Every listening TCP socket (address, port) of the trees, and which service's tree holds it;
    fails on any UDP socket (nothing of the stack should take datagrams)."""
    sockets = {}
    for service, processes in trees.items():
        for proc in processes:
            for conn in proc.net_connections(kind="inet"):
                assert conn.type != 2 or not conn.laddr, f"{service} pid {proc.pid} has a UDP socket {conn.laddr}"
                if conn.status == psutil.CONN_LISTEN:
                    sockets[(conn.laddr.ip, conn.laddr.port)] = service
    return sockets


def ask(host: str, port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    conn = (http.client.HTTPSConnection(host, port, timeout=10, context=context) if context
            else http.client.HTTPConnection(host, port, timeout=10))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def refused(host: str, port: int, requests: list[tuple], codes: set[int]) -> dict[str, int]:
    """The status of each anonymous request, every one of them in ``codes``."""
    answers = {f"{r[0]} {r[1]}": ask(host, port, *r)[0] for r in requests}
    assert set(answers.values()) <= codes, (port, answers)
    return answers


def only_open(host: str, port: int, requests: list[tuple], allowed: dict, refusal: bytes) -> dict[str, object]:
    """``allowed`` paths answer 200 with a body that passes their check; every other request is
    refused with 401 and ``refusal`` in its body."""
    answers: dict[str, object] = {}
    for path, check in allowed.items():
        code, body = ask(host, port, "GET", path)
        assert code == 200 and check(body), (port, path, code, body[:200])
        answers[f"GET {path}"] = 200
    for request in requests:
        code, body = ask(host, port, *request)
        assert code == 401 and refusal in body, (port, request[:2], code, body[:200])
        answers[f"{request[0]} {request[1]}"] = code
    return answers


def multipart(name: str, data: bytes) -> tuple[bytes, dict]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def stack_certificate(stack: Stack) -> ssl.SSLContext:
    """The store's own client certificate: what its parts use, and no one else has."""
    files = tls_files(stack.directory / "secrets" / "weed-tls")
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    return context


def weed_http(stack: Stack, host: str, port: int, name: str, upload: tuple[bytes, dict]) -> dict[str, object]:
    """A SeaweedFS HTTP port: plain HTTP gets Go's 400 "HTTP request to an HTTPS server" to every
    request, and TLS without the stack's client certificate no answer. With the certificate (the
    store's parts) the port answers, so the refusals are the server's, not a closed port's; the
    volume server then still wants a JWT for reading or writing a file."""
    requests = [*WEED_REQUESTS, ("POST", "/submit", *upload), ("POST", "/" + FILE_ID, *upload),
                ("PUT", "/buckets/dvc/anonymous.txt", b"x")]
    closed = 0
    for request in requests:
        try:
            code, body = ask(host, port, *request)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # Go's TLS server knows a plain request by its first bytes ("GET /", "POST ", "PUT /"): it
            # closes on a DELETE at once, and on the unread rest of a request with a body (a reset).
            closed += 1
            assert request[0] != "GET", (name, request[:2])
            continue
        assert code == 400 and PLAIN_TO_HTTPS in body, (name, request[:2], code, body[:200])
    assert https_without_certificate(host, port) is None, name
    own = stack_certificate(stack)
    code, _ = ask(host, port, "GET", "/healthz", context=own)
    assert code == (404 if name == "weed.filer" else 200), (name, code)   # the filer's HTTP API is off
    if name == "weed.volume":
        assert ask(host, port, "GET", "/" + FILE_ID, context=own) == (401, b'{"error":"wrong jwt"}')
    return {"plain HTTP": f"400 to {len(requests) - closed} of {len(requests)}, closed on {closed}",
            "TLS without certificate": "refused"}


def test_no_port_of_the_stack_answers_without_credentials(stack: Stack, tmp_path):
    env = stack.client_env
    s3 = boto3.client("s3", endpoint_url=env["TEAM_S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    key = f"open-doors/{uuid.uuid4().hex}"
    s3.put_object(Bucket="dvc", Key=key, Body=b"the team's data")
    names = {stack.port_base + offset: name for name, offset in PORT_OFFSETS.items()}
    sockets = listening(process_trees(stack))
    assert {port for _, port in sockets} <= set(names), f"ports nobody named: {sorted(sockets)}"
    answers: dict[str, object] = {}
    upload = multipart("anonymous.txt", b"written by a stranger")
    for host, port in sorted(sockets):
        name = names[port]
        label = f"{name} ({host}:{port})"
        if name == "postgres":
            import psycopg2
            for user in ("postgres", "mlflow", "prefect"):
                with pytest.raises(psycopg2.OperationalError, match="password"):
                    psycopg2.connect(host=host, port=port, user=user, dbname="postgres",
                                     passfile=str(tmp_path / "no-passfile"), connect_timeout=5)
            answers[label] = "password authentication refused"
        elif name == "s3":
            answers[label] = refused(host, port, [("GET", "/"), ("GET", "/dvc"), ("GET", f"/dvc/{key}"),
                                                  ("PUT", "/dvc/anonymous.txt", b"x"), ("DELETE", f"/dvc/{key}"),
                                                  ("GET", "/metrics"), ("GET", "/dir/status")], {403})
            for health in ("/healthz", "/status"):   # the gateway's health checks: empty bodies
                assert ask(host, port, "GET", health) == (200, b""), health
        elif name in GRPC:
            answers[label] = http2_without_certificate(host, port) or "no gRPC without the stack's certificate"
            assert answers[label] == "no gRPC without the stack's certificate", (label, answers[label])
        elif name in WEED_HTTP:
            answers[label] = weed_http(stack, host, port, name, upload)
        elif name == "mlflow":
            answers[label] = only_open(host, port, MLFLOW_CLOSED, MLFLOW_OPEN, b"You are not authenticated")
        elif name == "prefect":
            answers[label] = only_open(host, port, PREFECT_CLOSED, PREFECT_OPEN, b"Unauthorized")
        else:
            pytest.fail(f"port {port} ({name}) listens and has no probe here")
    print("\n".join(f"{n:32s} {a}" for n, a in answers.items()))
    # Nothing was written or deleted: the object is there, the stranger's file and user are not.
    assert s3.get_object(Bucket="dvc", Key=key)["Body"].read() == b"the team's data"
    assert s3.list_objects_v2(Bucket="dvc", Prefix="anonymous").get("KeyCount", 0) == 0
    admin = {"Authorization": "Basic " + base64.b64encode(
        f"{env['MLFLOW_TRACKING_USERNAME']}:{env['MLFLOW_TRACKING_PASSWORD']}".encode()).decode()}
    mlflow_port = stack.port_base + PORT_OFFSETS["mlflow"]
    assert ask("127.0.0.1", mlflow_port, "GET", "/api/2.0/mlflow/users/get?username=stranger", headers=admin)[0] == 404
    # Every client port and every internal one the store opens was probed.
    probed = {label.split()[0] for label in answers}
    assert {"postgres", "s3", "mlflow", "prefect"} | WEED_HTTP | GRPC <= probed, probed


def test_the_stores_unix_sockets_admit_their_owner_only(stack: Stack):
    """``weed`` also serves its gRPC (and the filer its HTTP) on Unix sockets in /tmp: connecting
    needs write permission on the socket file, which only its owner (the stack's user) has."""
    record = read_record(stack.directory / "run" / "s3.pid")
    sockets = {c.laddr for c in psutil.Process(record.pid).net_connections(kind="unix") if c.laddr}
    assert sockets
    for path in sockets:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and not mode & (stat.S_IWGRP | stat.S_IWOTH), (path, oct(mode))
