"""pipeline/stages/average.py: the model is the mean of the last N checkpoints (§6.1)."""

from pathlib import Path

import pytest
import torch

from transformer.checkpoint import load_checkpoint

pytestmark = pytest.mark.fast


def test_model_is_the_mean_of_the_last_checkpoints(workspace):
    model = load_checkpoint(workspace.path / "models/model.pt")
    ckpts = [load_checkpoint(workspace.path / f"models/checkpoints/checkpoint_{s:08d}.pt") for s in (20, 30, 40)]
    assert len(model["averaged_from"]) == 3
    for name, tensor in model["model"].items():
        mean = sum(c["model"][name].double() for c in ckpts) / 3
        torch.testing.assert_close(tensor, mean.to(tensor.dtype), rtol=0, atol=1e-7)
    assert model["model_config"] == ckpts[-1]["model_config"]
    # No run id, time or host in the file (a DVC output): the run is found by the model's content.
    assert set(model) == {"model_config", "model", "averaged_from"}


def test_the_training_run_is_tagged_with_the_model_it_made(workspace):
    from mlflow.tracking import MlflowClient

    from pipeline.tracking import links
    from transformer.atomic import file_sha256

    client = MlflowClient(workspace.tracking_uri, workspace.tracking_uri)
    sha = file_sha256(workspace.path / "models/model.pt")
    newest = file_sha256(workspace.path / "models/checkpoints/checkpoint_00000040.pt")
    run_id = links.find_run(links.LINK_MODEL, sha, "test-experiment", client)
    assert run_id is not None
    run = client.get_run(run_id)
    assert run.data.tags[links.LINK_MODEL] == sha
    assert run.data.tags[links.LINK_CHECKPOINT] == newest      # the training's own run: its last checkpoint
    assert run.data.params["average.last_n"] == "3"
    assert links.find_run(links.LINK_MODEL, "0" * 64, "test-experiment", client) is None


def test_fewer_checkpoints_than_asked_for_are_averaged_with_a_warning(workspace, tmp_path, monkeypatch, capsys):
    import shutil

    from pipeline.stages.average import average

    (tmp_path / "models" / "checkpoints").mkdir(parents=True)
    for step in (30, 40):
        name = f"checkpoint_{step:08d}.pt"
        shutil.copy(workspace.path / "models/checkpoints" / name, tmp_path / "models/checkpoints" / name)
    monkeypatch.chdir(tmp_path)
    averaged = average(5)
    assert [Path(p).name for p in averaged["averaged_from"]] == ["checkpoint_00000030.pt", "checkpoint_00000040.pt"]
    err = capsys.readouterr().err
    assert "warning: average.last_n is 5 but models/checkpoints holds 2 checkpoint(s): averaging 2" in err
