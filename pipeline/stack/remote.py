"""The team's DVC remote in a clone: ``configure`` writes it into the clone's git-ignored
``.dvc/config.local`` (its name, URL and endpoint; the keys stay in the environment, never in DVC's
config), and ``transfer`` runs ``dvc push --run-cache`` / ``dvc pull`` with DVC's output as it comes,
except that one line per file that failed becomes one error naming the remote and what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.stack.client_env import ENDPOINT_VAR, REMOTE_URL_VAR
from pipeline.stack.processes import StackError
from pipeline.stack.remote_check import remote_problem

REMOTE_NAME = "team"
FAILED_FILE = "ERROR: failed to transfer"


def dvc_program() -> str:
    return os.path.join(os.path.dirname(sys.executable), "dvc")


def configure_remote(repo: Path) -> str:
    """Point the clone's DVC at the team's remote (``TEAM_DVC_REMOTE_URL`` at ``TEAM_S3_ENDPOINT_URL``)
    as its default, in ``.dvc/config.local`` (git-ignored); returns a one-line summary."""
    url, endpoint = os.environ.get(REMOTE_URL_VAR), os.environ.get(ENDPOINT_VAR)
    if not (url and endpoint):
        raise StackError(f"{REMOTE_URL_VAR} and {ENDPOINT_VAR} are not set: source the stack's env file first")
    dvc = dvc_program()
    for argv in ([dvc, "remote", "add", "--local", "--force", "--default", REMOTE_NAME, url],
                 [dvc, "remote", "modify", "--local", REMOTE_NAME, "endpointurl", endpoint]):
        proc = subprocess.run(argv, cwd=repo, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"{' '.join(argv[1:4])} failed: {(proc.stderr or proc.stdout).strip()}")
    return f"DVC remote {REMOTE_NAME!r} (default, in .dvc/config.local): {url} at {endpoint}"


def transfer(repo: Path, direction: str) -> None:
    """``dvc push --run-cache`` (data, models, reports and the stages' run-cache) or ``dvc pull`` to or
    from the default remote; a failure is one StackError naming the remote (nothing local is lost:
    DVC's cache is only read by a push, and a pull writes a file only once it is complete). The
    store is asked first whether it lets this environment's keys in: a refusal (403) or a store
    that does not answer stops it before DVC runs, said as such."""
    name, url, endpoint, own_keys = default_remote(repo)
    remote = describe(name, url, endpoint)
    # Keys in DVC's own config (not the stack's way) are DVC's business; the check uses the environment's.
    problem = remote_problem(url, endpoint) if url.startswith("s3://") and not own_keys else None
    if problem:
        raise StackError(f"dvc {direction} with remote {remote}: {problem}; nothing was transferred")
    argv = [dvc_program(), direction, *(["--run-cache"] if direction == "push" else [])]
    proc = subprocess.Popen(argv, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed, first_failure, last_error = 0, "", ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(FAILED_FILE):
            failed += 1
            first_failure = first_failure or line.split(" - ", 1)[-1].strip()
            continue
        if line.startswith("ERROR:"):
            last_error = line.strip()
        print(line, end="", flush=True)
    if proc.wait() == 0:
        return
    problem = remote_problem(url, endpoint) if url.startswith("s3://") and not own_keys else None
    if problem and "unreachable" not in problem:   # the store answered, and refused: no retry helps
        raise StackError(f"dvc {direction} with remote {remote} failed: {problem}")
    reason = f"{failed} file(s) not transferred, the first: {first_failure}" if failed else last_error
    fix = ("nothing local was lost; run it again once the remote answers" if direction == "push"
           else "files already pulled are complete; run it again once the remote answers")
    raise StackError(f"dvc {direction} with remote {remote} failed: {reason}. {fix}")


def default_remote(repo: Path) -> tuple[str, str, str, bool]:
    """The default remote's name, URL and endpoint as DVC's config has them (one ``dvc config -l``),
    and whether that config holds keys of its own."""
    out = subprocess.run([dvc_program(), "config", "-l"], cwd=repo, capture_output=True, text=True).stdout
    config = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    name = config.get("core.remote", "")
    if not name:
        raise StackError("no default DVC remote: source the stack's env file and run make stack-remote")
    return (name, config.get(f"remote.{name}.url", ""), config.get(f"remote.{name}.endpointurl", ""),
            bool(config.get(f"remote.{name}.access_key_id")))


def describe(name: str, url: str, endpoint: str) -> str:
    return f"{name!r} ({url}{' at ' + endpoint if endpoint else ''})"

