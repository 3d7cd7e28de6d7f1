"""A worker's results as a git commit on a branch of the repository it came from.

What another machine needs to ``dvc pull`` exactly what a run made is small and lives in git:
``dvc.lock``, ``params.yaml`` (a fine-tuning experiment leaves its overrides there) and the
``.dvc`` files of data the run versioned (``data/incoming/*.dvc``, ``models/init/*.dvc``), with
the ``.gitignore`` entries ``dvc add`` wrote. The commit's first parent is the pinned commit the
run checked out; when the branch already exists, its tip is the second parent, so every push is a
fast-forward and the branch keeps each run's result in its history (``git log --first-parent``
of the tip shows the newest run's code). A colleague: ``git fetch origin <branch> && git checkout
FETCH_HEAD && dvc pull``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

RESULT_PATHS = ("dvc.lock", "params.yaml", ":(glob)**/*.dvc", ":(glob)**/.gitignore")
_BRANCH = re.compile(r"^(?!/)(?!.*(?:\.\.|//|@\{|\.lock$|/$|\.$))[A-Za-z0-9._/-]+$")


class ResultsError(RuntimeError):
    """Committing or pushing the results failed: one message saying which git command and why."""


@dataclass(frozen=True)
class Published:
    branch: str
    commit: str          # the branch's new tip ("" when nothing changed since its tip)
    base: str            # the pinned commit the run checked out
    changed: tuple[str, ...]


def check_branch(branch: str) -> str:
    if not _BRANCH.match(branch):
        raise ResultsError(f"results branch {branch!r} is not a valid git branch name")
    return branch


def _git(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise ResultsError(f"git {' '.join(args[:3])} failed in {root}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


def identity_env() -> dict[str, str]:
    """The commit's author: the worker's git identity when it has one, else the worker's host name."""
    env = dict(os.environ)
    host = socket.gethostname()
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", f"retraining worker on {host}")
        env.setdefault(f"GIT_{role}_EMAIL", f"worker@{host}")
    return env


def remote_tip(root: Path, branch: str) -> str:
    """The branch's commit on ``origin`` (fetched into ``refs/remotes/origin/<branch>``), "" if none."""
    if not _git(root, "ls-remote", "--heads", "origin", f"refs/heads/{branch}"):
        return ""
    _git(root, "fetch", "--quiet", "origin", f"+refs/heads/{branch}:refs/remotes/origin/{branch}")
    return _git(root, "rev-parse", f"refs/remotes/origin/{branch}")


def publish(root: Path, branch: str, message: str) -> Published:
    """Commit the run's result files on top of the checked-out commit (and the branch's tip) and
    push them to ``origin``'s ``branch``."""
    check_branch(branch)
    base = _git(root, "rev-parse", "HEAD")
    tip = remote_tip(root, branch)
    # ls-files, not add, matches the patterns: add fails on a pattern that matches nothing.
    files = _git(root, "ls-files", "--modified", "--others", "--exclude-standard", "--", *RESULT_PATHS).splitlines()
    if files:
        _git(root, "add", "--", *sorted(set(files)))
    tree = _git(root, "write-tree")
    reference = tip or base
    changed = tuple(_git(root, "diff", "--name-only", reference, tree).splitlines())
    if not changed:
        return Published(branch, "", base, ())
    parents = ["-p", base] + (["-p", tip] if tip and tip != base else [])
    commit = _git(root, "commit-tree", tree, *parents, "-m", message, env=identity_env())
    _git(root, "push", "--quiet", "origin", f"{commit}:refs/heads/{branch}")
    return Published(branch, commit, base, changed)
