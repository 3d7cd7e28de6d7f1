"""pipeline/stages/average.py: the model is the mean of the last N checkpoints (§6.1)."""

import torch

from transformer.checkpoint import load_checkpoint


def test_model_is_the_mean_of_the_last_checkpoints(workspace):
    model = load_checkpoint(workspace.path / "models/model.pt")
    ckpts = [load_checkpoint(workspace.path / f"models/checkpoints/checkpoint_{s:08d}.pt") for s in (20, 30, 40)]
    assert len(model["averaged_from"]) == 3
    for name, tensor in model["model"].items():
        mean = sum(c["model"][name].double() for c in ckpts) / 3
        torch.testing.assert_close(tensor, mean.to(tensor.dtype), rtol=0, atol=1e-7)
    assert model["model_config"] == ckpts[-1]["model_config"]
    assert model["callbacks"]["mlflow_run_id"]  # the run that evaluate logs into
