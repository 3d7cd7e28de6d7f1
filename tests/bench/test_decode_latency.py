"""bench/decode_latency.py runs end to end on a tiny random model with a real tokenizer (trained on
the Multi30k mirror's first lines), prints each engine's latencies side by side (ours, ours through
CTranslate2, raw CTranslate2), the profile's shares, ``wrapper=`` and ``ratio=`` last. Speeds are
printed, never asserted."""

import gzip
import re

import pytest
import torch

from tests.bench import run_bench
from tests.pipeline.conftest import MIRROR
from transformer.checkpoint import model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer, train_tokenizer

pytestmark = pytest.mark.slow


def test_decode_latency_bench_compares_one_sentence_decoding_and_profiles_ours(tmp_path):
    source = MIRROR / "data/task1/raw/train.en.gz"
    if not source.is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    with gzip.open(source, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line, _ in zip(f, range(400))]
    train_tokenizer(lines, tmp_path / "spm.model", 200)
    vocab_size = Tokenizer(tmp_path / "spm.model").vocab_size
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "model.pt", model_checkpoint(Transformer(build_config("tiny", vocab_size)).eval()))
    (tmp_path / "test.en").write_text("\n".join(lines[:4]) + "\n")
    result = run_bench("decode_latency.py", ["--model", str(tmp_path / "model.pt"), "--tokenizer",
                                             str(tmp_path / "spm.model"), "--data", str(tmp_path / "test.en"),
                                             "--sentences", "4", "--rounds", "1", "--max-len-b", "5"], tmp_path)
    out = result.stdout
    assert "4 sentences" in out and "one at a time" in out and "CTranslate2 4." in out
    assert "ours: beam 4, alpha 0.6, stopping exact (from §6.1)" in out   # no params file: the paper's
    assert "CTranslate2: beam 4, alpha 0.6, float32 (from §6.1)" in out
    for engine in ("ours", "ours through CTranslate2", "raw CTranslate2"):
        for search in ("beam", "greedy"):
            assert re.search(rf"\| {engine}, {search} \| [\d.]+ ms \| [\d.]+ ms \| [\d.]+ ms \|", out), engine
    # The wrapper passes raw CTranslate2's options: the same outputs.
    assert re.search(r"identical beam outputs, ours through CTranslate2 and raw: 4/4; ours and CTranslate2: \d/4", out)
    shares = [int(x) for x in re.search(r"kernels: (\d+)%; other operators: (\d+)%; outside operators "
                                        r"\(Python, dispatch\): (-?\d+)%", out).groups()]
    assert abs(sum(shares) - 100) <= 2
    assert float(re.search(r"([\d.]+) decoding steps", out).group(1)) >= 1
    *_, wrapper, ratio = out.strip().splitlines()
    assert wrapper.startswith("wrapper=") and float(wrapper.split("=")[1]) > 0
    assert ratio.startswith("ratio=") and float(ratio.split("=")[1]) > 0
