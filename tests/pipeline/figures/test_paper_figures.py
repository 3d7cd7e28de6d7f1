"""pipeline/figures/paper_figures.py: every figure of docs/paper.md is written and is a real image, and the
worked numbers are right (checked here against hand computations, not against the module's own)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.figures import paper_figures

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict]:
    """One run on the tiny preset (no trained model) into a temporary folder."""
    out = tmp_path_factory.mktemp("figures")
    numbers = paper_figures.generate(out)
    return out, numbers


def test_every_figure_is_a_non_trivial_png(generated):
    out, _ = generated
    for name in paper_figures.FIGURES:
        path = out / name
        assert path.is_file(), name
        with Image.open(path) as image:
            assert image.format == "PNG", name
            image.verify()
        with Image.open(path) as image:
            width, height = image.size
            assert width >= 300 and height >= 200, (name, image.size)
            colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
            assert colours is None or len(colours) > 20, f"{name} is nearly blank"
    assert json.loads((out / "worked_numbers.json").read_text())["attention"]["tokens"] == ["the", "cat", "sat"]
    assert "# Worked numbers" in (out / "worked_numbers.md").read_text()


def test_attention_weights_match_a_hand_computation(generated):
    a = generated[1]["attention"]
    q, k, v = (np.array(m) for m in (a["Q"], a["K"], a["V"]))
    scores = q @ k.T / 2.0                                       # sqrt(d_k) = sqrt(4)
    weights = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(a["scores"], scores, atol=1e-4)
    np.testing.assert_allclose(a["weights"], weights, atol=1e-4)
    np.testing.assert_allclose(a["output"], weights @ v, atol=1e-4)
    np.testing.assert_allclose(a["row_sums"], 1.0, atol=1e-4)
    # The first row by hand: scores (1, 0, 0.5) -> e^1, e^0, e^0.5 over their sum.
    total = math.e + 1 + math.exp(0.5)
    assert a["weights"][0] == pytest.approx([math.e / total, 1 / total, math.exp(0.5) / total], abs=1e-4)
    assert a["max_difference_from_hand"] < 1e-6
    assert generated[1]["multi_head"]["max_difference_head_by_head"] < 1e-5


def test_masks(generated):
    m = generated[1]["masks"]
    assert m["padding_mask"] == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert m["causal_mask"] == np.tril(np.ones((5, 5), dtype=int)).tolist()
    for i, row in enumerate(m["causal_weights"]):                 # equal scores: 1/(i+1) on keys 1..i+1
        assert row == pytest.approx([1 / (i + 1)] * (i + 1) + [0.0] * (4 - i), abs=1e-4)
    assert all(row == pytest.approx([1 / 3] * 3 + [0, 0], abs=1e-4) for row in m["padding_weights_sentence2"])


def test_label_smoothed_target(generated):
    s = generated[1]["label_smoothing"]
    vocab, eps = len(s["vocab"]), s["epsilon"]
    gold = s["vocab"].index(s["gold"])
    assert sum(s["target"]) == pytest.approx(1.0, abs=1e-4)
    assert s["target"][gold] == pytest.approx(1 - eps + eps / vocab, abs=1e-5)        # 0.91667
    assert all(t == pytest.approx(eps / vocab, abs=1e-5) for i, t in enumerate(s["target"]) if i != gold)
    logits = np.array(s["logits"])
    log_p = logits - np.log(np.exp(logits).sum())
    assert s["loss_code"] == pytest.approx(-(np.array(s["target"]) * log_p).sum(), abs=1e-4)
    assert s["nll"] == pytest.approx(-log_p[gold], abs=1e-4)
    assert s["dropout"]["kept_value"] == pytest.approx(1 / 0.9, abs=1e-3)
    assert s["dropout"]["zero_fraction"] == pytest.approx(0.1, abs=0.01)


def test_learning_rate_peaks_at_warmup_with_eq3_value(generated):
    lr = generated[1]["learning_rate"]
    for curve in lr["curves"].values():
        d, warmup, scale = curve["d_model"], curve["warmup_steps"], curve["scale"]
        assert curve["peak_step"] == warmup
        assert curve["peak_lr"] == pytest.approx(scale * d ** -0.5 * warmup ** -0.5, rel=1e-9)
    assert lr["curves"]["paper base"]["peak_lr"] == pytest.approx(6.988e-4, rel=1e-3)
    repo = lr["curves"]["this repository's default"]
    assert lr["scheduler_lr_at_warmup"] == pytest.approx(repo["peak_lr"], rel=1e-9)
    assert lr["adam"] == {"betas": [0.9, 0.98], "eps": 1e-9}


def test_positions_stacks_search_and_averaging(generated):
    n = generated[1]
    assert n["positional"]["pe_pos1_first4"] == pytest.approx(
        [math.sin(1), math.cos(1), math.sin(1 / 10000 ** (2 / 512)), math.cos(1 / 10000 ** (2 / 512))], abs=1e-4)
    assert n["embedding"]["row_std_after"] == pytest.approx(1.0, abs=0.1)
    assert n["residual"]["rms"]["post-LN (paper)"] == pytest.approx([1.0] * 12, abs=1e-3)
    assert n["stacks"]["base"]["total"] == 63_082_496 and n["stacks"]["base"]["tied"]
    assert n["feed_forward"]["base_parameters"] == 2 * 512 * 2048 + 2048 + 512
    assert n["length_penalty"]["pairs"]["0.0"]["kept"] == "short"
    assert n["length_penalty"]["pairs"]["2.0"]["kept"] == "long"
    c = n["checkpoint_averaging"]
    assert c["average"] == pytest.approx(sum(c["values"]) / 3, abs=1e-5)
    d = n["decoding"]
    assert not d["trained"] and "randomly initialised" in d["model"]
    assert d["reference_pieces"][-1] == "</s>" and len(d["p_reference"]) == d["reference_length"]


def test_paper_md_shows_every_figure_and_the_generated_numbers(generated):
    paper = (REPO / "docs" / "paper.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"figures/([\w.]+\.png)", paper))
    assert shown == set(paper_figures.FIGURES)
    a = generated[1]["attention"]
    for value in (*a["weights"][0], *a["weights"][1]):           # the worked table is the code's
        assert f"{value:.3f}" in paper


def test_cli_needs_both_model_and_tokenizer(tmp_path, capsys):
    assert paper_figures.main(["--out", str(tmp_path), "--model", "models/model.pt", "--params", "none"]) == 2
    assert "both --model and --tokenizer" in capsys.readouterr().err
