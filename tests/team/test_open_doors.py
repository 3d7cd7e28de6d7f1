"""No open door: every TCP port that the stack's process trees listen on (found from the recorded
PIDs, not from a list) is asked, without credentials, to list, read, write, delete or assign, and
answers nothing but a refusal. Allowed without credentials: health endpoints, static UI files,
status and metrics pages without data, and PostgreSQL's authentication refusal."""

from __future__ import annotations

import http.client
import os
import stat
import uuid

import boto3
import psutil
import pytest

from pipeline.stack.groups import read_record
from pipeline.stack.probes import http2_without_certificate
from pipeline.stack.settings import PORT_OFFSETS

from .conftest import Stack

SERVICES = ("postgres", "s3", "mlflow", "prefect")
GRPC = {"weed.master.grpc", "weed.volume.grpc", "weed.filer.grpc", "weed.s3.grpc", "weed.admin.grpc"}


def process_trees(stack: Stack) -> dict[str, list[psutil.Process]]:
    trees = {}
    for name in SERVICES:
        record = read_record(stack.directory / "run" / f"{name}.pid")
        assert record is not None, name
        leader = psutil.Process(record.pid)
        trees[name] = [leader, *leader.children(recursive=True)]
    return trees


def listening(trees: dict[str, list[psutil.Process]]) -> dict[int, str]:
    """Every listening TCP port of the trees, and which service's tree holds it."""
    ports = {}
    for service, processes in trees.items():
        for proc in processes:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    ports[conn.laddr.port] = service
    return ports


def status(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def refused(port: int, requests: list[tuple]) -> dict[str, int]:
    """The status of each anonymous request; the test wants no 2xx (and no redirect to data) among them."""
    answers = {f"{r[0]} {r[1]}": status(port, *r) for r in requests}
    assert all(code >= 400 for code in answers.values()), (port, answers)
    return answers


def multipart(name: str, data: bytes) -> tuple[bytes, dict]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def test_no_port_of_the_stack_answers_without_credentials(stack: Stack, tmp_path):
    env = stack.client_env
    s3 = boto3.client("s3", endpoint_url=env["TEAM_S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    key = f"open-doors/{uuid.uuid4().hex}"
    s3.put_object(Bucket="dvc", Key=key, Body=b"the team's data")
    names = {stack.port_base + offset: name for name, offset in PORT_OFFSETS.items()}
    trees = process_trees(stack)
    ports = listening(trees)
    assert set(ports) <= set(names), f"ports nobody named: {sorted(set(ports) - set(names))}"
    answers: dict[str, object] = {}
    upload, upload_headers = multipart("anonymous.txt", b"written by a stranger")
    for port in sorted(ports):
        name = names[port]
        if name == "postgres":
            import psycopg2
            for user in ("postgres", "mlflow", "prefect"):
                with pytest.raises(psycopg2.OperationalError, match="password"):
                    psycopg2.connect(host="127.0.0.1", port=port, user=user, dbname="postgres",
                                     passfile=str(tmp_path / "no-passfile"), connect_timeout=5)
            answers[name] = "password authentication refused"
        elif name == "s3":
            answers[name] = refused(port, [("GET", "/"), ("GET", "/dvc"), ("GET", f"/dvc/{key}"),
                                           ("PUT", "/dvc/anonymous.txt", b"x"), ("DELETE", f"/dvc/{key}")])
            assert set(answers[name].values()) == {403}, answers[name]
        elif name in GRPC:
            answers[name] = http2_without_certificate("127.0.0.1", port) or "no gRPC without the stack's certificate"
            assert answers[name] == "no gRPC without the stack's certificate", (name, answers[name])
        elif name == "weed.master":
            answers[name] = refused(port, [("GET", "/dir/assign"), ("POST", "/dir/assign"),
                                           ("GET", "/dir/lookup?volumeId=1"), ("GET", "/vol/grow?count=1"),
                                           ("GET", "/vol/status"), ("GET", "/col/delete?collection=none-such"),
                                           ("POST", "/submit", upload, upload_headers)])
        elif name == "weed.volume":
            answers[name] = refused(port, [("GET", "/1,01637037d6"), ("POST", "/1,01637037d6", upload, upload_headers),
                                           ("DELETE", "/1,01637037d6")])
            assert set(answers[name].values()) == {401}, answers[name]   # the JWT is checked before anything else
        elif name == "weed.filer":
            answers[name] = refused(port, [("GET", "/buckets/"), ("GET", "/buckets/dvc/open-doors/"),
                                           ("GET", f"/buckets/dvc/{key}"), ("GET", "/?proxyChunkId=1,01637037d6"),
                                           ("POST", "/buckets/dvc/anonymous.txt", upload, upload_headers),
                                           ("PUT", "/buckets/dvc/anonymous.txt", b"x"),
                                           ("DELETE", f"/buckets/dvc/{key}")])
        elif name == "weed.admin":
            answers[name] = refused(port, [("GET", "/"), ("GET", "/files"), ("GET", "/api/cluster/topology"),
                                           ("GET", "/api/s3/buckets")])
        elif name == "mlflow":
            answers[name] = refused(port, [("GET", "/"), ("GET", "/api/2.0/mlflow/experiments/search?max_results=1"),
                                           ("POST", "/api/2.0/mlflow/runs/create", b"{}"),
                                           ("GET", "/api/2.0/mlflow-artifacts/artifacts"),
                                           ("GET", "/ajax-api/2.0/mlflow/registered-models/search")])
            assert set(answers[name].values()) == {401}, answers[name]
            assert status(port, "GET", "/health") == 200
        elif name == "prefect":
            answers[name] = refused(port, [("POST", "/api/flows/filter", b"{}"),
                                           ("POST", "/api/work_pools/filter", b"{}"),
                                           ("POST", "/api/deployments/filter", b"{}"), ("GET", "/api/admin/settings")])
            assert set(answers[name].values()) == {401}, answers[name]
            assert status(port, "GET", "/api/health") == 200
        else:
            pytest.fail(f"port {port} ({name}) listens and has no probe here")
    print("\n".join(f"{n:18s} {a}" for n, a in answers.items()))
    # Nothing was written or deleted: the object is there, the stranger's file is not.
    assert s3.get_object(Bucket="dvc", Key=key)["Body"].read() == b"the team's data"
    listed = s3.list_objects_v2(Bucket="dvc", Prefix="anonymous").get("KeyCount", 0)
    assert listed == 0
    # Every client port and every internal one the store opens was probed.
    assert {"postgres", "s3", "mlflow", "prefect", "weed.filer", "weed.master", "weed.volume"} <= set(answers)
    assert GRPC <= set(answers)


def test_the_stores_unix_sockets_admit_their_owner_only(stack: Stack):
    """``weed`` also serves its gRPC on Unix sockets in /tmp: connecting needs write permission on
    the socket file, which only its owner (the stack's user) has."""
    record = read_record(stack.directory / "run" / "s3.pid")
    sockets = {c.laddr for c in psutil.Process(record.pid).net_connections(kind="unix") if c.laddr}
    assert sockets
    for path in sockets:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and not mode & (stat.S_IWGRP | stat.S_IWOTH), (path, oct(mode))
