"""Where a worker's flow runs: a clone of its own, kept between runs, at the deployment's commit.

Prefect's ``git_clone`` pull step clones into a fresh temporary folder for every flow run, which
dies with the run, and so would every checkpoint a killed training left and the DVC cache. The
deployment's pull steps here instead keep one clone per worker, at ``$TEAM_WORKSPACE`` (set in the
worker's environment, so every worker host chooses its own): the first run clones the repository,
every run fetches and checks out the pinned commit (``--force``: tracked files become the commit's;
untracked and ignored files, i.e. the pipeline's outputs, checkpoints and ``.dvc/cache``, stay),
then works there (``set_working_directory``).
"""

from __future__ import annotations

import re
from typing import Any

WORKSPACE_VAR = "TEAM_WORKSPACE"
_SHA = re.compile(r"^[0-9a-f]{40}$")

# Prefect's run_shell_script runs each line in a shell of its own and stops at the first that
# fails, so every line stands alone. ``fetch origin`` (every branch and tag): fetching one sha by
# name needs uploadpack.allowReachableSHA1InWant on the server, which a plain git daemon does not set.
W = f'"${WORKSPACE_VAR}"'
MISSING = f"set {WORKSPACE_VAR} in the worker's environment: the folder of its clone"
CHECKOUT_SCRIPT = f"""test -n "${WORKSPACE_VAR}" || {{ echo "{MISSING}" >&2; exit 1; }}
test -d {W}/.git || git clone --quiet --no-checkout "$TEAM_REPOSITORY" {W}
git -C {W} remote set-url origin "$TEAM_REPOSITORY"
git -C {W} fetch --quiet --tags origin
git -C {W} checkout --quiet --force --detach "$TEAM_COMMIT"
echo "workspace ${WORKSPACE_VAR} at $(git -C {W} rev-parse HEAD)"
"""


class WorkspaceError(ValueError):
    """A bad repository or commit for a deployment: one message naming it."""


def pull_steps(repository: str, commit: str) -> list[dict[str, Any]]:
    """The deployment's pull steps: check out ``commit`` of ``repository`` in ``$TEAM_WORKSPACE`` and
    run the flow there (``{{ $VAR }}`` is resolved from the flow run's environment by Prefect)."""
    if not _SHA.match(commit):
        raise WorkspaceError(f"commit {commit!r} is not a full 40-character sha: a deployment pins one commit")
    if not repository:
        raise WorkspaceError("repository: the git URL the workers clone is empty")
    return [
        {"prefect.deployments.steps.run_shell_script": {
            "id": "checkout", "script": CHECKOUT_SCRIPT, "shell": True, "stream_output": True,
            "env": {"TEAM_REPOSITORY": repository, "TEAM_COMMIT": commit}}},
        {"prefect.deployments.steps.set_working_directory": {"directory": f"{{{{ ${WORKSPACE_VAR} }}}}"}},
    ]
