"""The CTranslate2 export (pipeline/serving/export.py) computes what our model computes.

Random weights check the numbers: CTranslate2's teacher-forced log-probabilities equal
ours for every configuration (post-LN/pre-LN, ReLU/GELU, learned positions, untied
embeddings). Tiny models trained to copy (post-LN ReLU and pre-LN GELU) check decoding:
CTranslate2's greedy search returns the token ids of ``transformer.search.greedy_search``.
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import torch

from pipeline.serving.export import TOKENIZER_NAME, export_ctranslate2, main, sentencepiece_vocabulary
from transformer.checkpoint import CheckpointError, model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.data import write_token_store
from transformer.model import Transformer
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import train_tokenizer
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer.trainer import TrainConfig, Trainer

VOCAB = 24
CONFIGS = {
    "post-ln-relu": {},
    "pre-ln-gelu": dict(norm_first=True, activation="gelu"),
    "pre-ln-relu-learned-untied": dict(norm_first=True, positional="learned", share_embeddings=False),
    "post-ln-gelu": dict(activation="gelu"),
}


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """A 24-piece SentencePiece model: ids 0-3 are <pad> <unk> <s> </s>, 4-23 ordinary pieces."""
    rng = random.Random(0)
    texts = [" ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 4))) for _ in range(8))
             for _ in range(500)]
    path = tmp_path_factory.mktemp("spm") / "spm.model"
    assert train_tokenizer(texts, path, vocab_size=VOCAB).vocab_size == VOCAB
    return path


def pad(rows: Sequence[Sequence[int]], end: Sequence[int] = (EOS_ID,)) -> torch.Tensor:
    """Ids + EOS, right-padded: the source layout of pipeline.serving.translator.Translator.source_tensor."""
    rows = [[*r, *end] for r in rows]
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out


def ct2_search(translator: ctranslate2.Translator, vocab: list[str], sources: list[list[int]], *,
               beam_size: int, max_len_b: int = 50, length_penalty: float = 0.0) -> list[list[int]]:
    """CTranslate2 decoding of id sequences, with our length limit: at most
    len(source) + 1 + max_len_b - 1 tokens before EOS (``transformer.search._max_lengths``).
    CTranslate2 takes one limit per call, so sources are grouped by length."""
    index = {piece: i for i, piece in enumerate(vocab)}
    groups: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(sources):
        groups[len(s)].append(i)
    out: list[list[int]] = [[] for _ in sources]
    for length, rows in groups.items():
        results = translator.translate_batch(
            [[vocab[t] for t in sources[i]] for i in rows], beam_size=beam_size, length_penalty=length_penalty,
            min_decoding_length=0, max_decoding_length=length + max_len_b)
        for i, r in zip(rows, results):
            out[i] = [index[p] for p in r.hypotheses[0]]
    return out


def export(model: Transformer, tokenizer_file: Path, out: Path) -> tuple[ctranslate2.Translator, list[str]]:
    """Export fp32 weights and load them for fp32 computation on one CPU thread."""
    path = export_ctranslate2(model, tokenizer_file, out)
    translator = ctranslate2.Translator(str(path), device="cpu", compute_type="float32", intra_threads=1)
    return translator, sentencepiece_vocabulary(path / TOKENIZER_NAME)


@pytest.mark.parametrize("name", CONFIGS)
def test_log_probabilities_match_random_weights(name, tokenizer_file, tmp_path):
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", VOCAB, **CONFIGS[name])).eval()
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    rng = random.Random(1)
    src = [[rng.randint(4, VOCAB - 1) for _ in range(rng.randint(1, 12))] for _ in range(10)]
    tgt = [[rng.randint(4, VOCAB - 1) for _ in range(rng.randint(1, 12))] for _ in range(10)]
    scored = translator.score_batch([[vocab[i] for i in s] for s in src], [[vocab[i] for i in t] for t in tgt])
    with torch.no_grad():
        tgt_in = pad([[BOS_ID, *t] for t in tgt], end=())
        lprobs = torch.log_softmax(model(pad(src), tgt_in), dim=-1)
    for i, (t, result) in enumerate(zip(tgt, scored)):
        assert result.tokens == [vocab[j] for j in t] + ["</s>"]
        ours = lprobs[i, torch.arange(len(t) + 1), torch.tensor([*t, EOS_ID])]
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=1e-4, rtol=0)


def train_copy(overrides: dict, steps: int = 500) -> Transformer:
    """``tiny`` trained to copy 4-8 ids out of 20 (500 updates, about 7 s on one thread: after 400,
    post-LN copied 28 of the 30 in-distribution probes, which left int8 one sentence from its bar)."""
    rng = np.random.default_rng(0)
    pairs = [(s, s) for s in (rng.integers(4, VOCAB, size=rng.integers(4, 9)).tolist() for _ in range(3000))]
    with tempfile.TemporaryDirectory() as tmp:
        store = write_token_store(Path(tmp) / "copy", pairs, vocab_size=VOCAB)
        torch.manual_seed(0)
        model = Transformer(build_config("tiny", VOCAB, **overrides))
        config = TrainConfig(max_tokens=640, warmup_steps=50, max_steps=steps, checkpoint_every_steps=0,
                             log_every=10_000, precision="fp32", device="cpu", pad_multiple=1, seed=1)
        Trainer(model, config, store).train()
    return model.eval()


TRAINED = ("post-ln-relu", "pre-ln-gelu")


@pytest.fixture(scope="module")
def trained() -> Callable[[str], Transformer]:
    """Copy models of the named configurations, each trained once per module on one thread."""
    models: dict[str, Transformer] = {}

    def get(name: str) -> Transformer:
        if name not in models:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                models[name] = train_copy(CONFIGS[name])
            finally:
                torch.set_num_threads(threads)
        return models[name]
    return get


def probe_sources() -> list[list[int]]:
    """In-distribution lengths (4-8) and lengths the model never saw (1-3, 9-14)."""
    rng = random.Random(2)
    return [[rng.randint(4, VOCAB - 1) for _ in range(n)] for n in [*range(1, 15)] * 6]


@pytest.mark.parametrize("name", TRAINED)
def test_greedy_matches_ctranslate2(name, trained, tokenizer_file, tmp_path):
    model = trained(name)
    sources = probe_sources()
    ours = greedy_search(model, pad(sources)).hypotheses
    in_dist = [h == s for h, s in zip(ours, sources) if 4 <= len(s) <= 8]
    assert np.mean(in_dist) > 0.9, f"{name}: the copy model did not train"
    # Out of distribution about half the outputs are not copies, several run to the length
    # limit: the comparison covers uncertain steps and the limit, not only easy copies.
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    theirs = ct2_search(translator, vocab, sources, beam_size=1)
    mismatches = [(s, o, t) for s, o, t in zip(sources, ours, theirs) if o != t]
    assert not mismatches, f"{name}: {len(mismatches)} of {len(sources)} differ, e.g. {mismatches[:2]}"


@pytest.mark.parametrize("name", TRAINED)
def test_beam_agreement_reported(name, trained, tokenizer_file, tmp_path, capsys):
    """Beam 4 is compared and reported, not required to match in general. Our beam search
    scores a finished hypothesis log P / ((5 + |Y|) / 6) ** alpha (GNMT, |Y| counting EOS)
    and stops a sentence once K hypotheses have finished; CTranslate2 divides by
    |Y| ** length_penalty and stops on its own criterion (``patience``). With
    alpha = length_penalty = 0 both rank by log P (they agreed on every probe when written);
    with alpha = length_penalty = 0.6 the penalties differ, and so may the choices."""
    model = trained(name)
    sources = probe_sources()
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    agreement = {}
    for alpha in (0.0, 0.6):
        ours = beam_search(model, pad(sources), beam_size=4, alpha=alpha).hypotheses
        theirs = ct2_search(translator, vocab, sources, beam_size=4, length_penalty=alpha)
        agreement[alpha] = [o == t for o, t in zip(ours, theirs)]
    with capsys.disabled():
        print(f"\n[{name}] beam 4 agreement with CTranslate2 on {len(sources)} sources: "
              f"alpha=length_penalty=0 {np.mean(agreement[0.0]):.1%}, 0.6 {np.mean(agreement[0.6]):.1%}")
    in_dist = [same for same, s in zip(agreement[0.0], sources) if 4 <= len(s) <= 8]
    assert np.mean(in_dist) > 0.9  # confident copies: both beams must find them


def test_command_line_export_int8(trained, tokenizer_file, tmp_path):
    model = trained("post-ln-relu")
    save_checkpoint(tmp_path / "model.pt", model_checkpoint(model))
    out = tmp_path / "ct2-int8"
    main(["ctranslate2", "--model", str(tmp_path / "model.pt"), "--tokenizer", str(tokenizer_file),
          "--output", str(out), "--quantization", "int8"])
    assert {p.name for p in out.iterdir()} == {"model.bin", "config.json", "shared_vocabulary.json", TOKENIZER_NAME}
    assert (out / TOKENIZER_NAME).read_bytes() == tokenizer_file.read_bytes()
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="int8", intra_threads=1)
    sources = [s for s in probe_sources() if 4 <= len(s) <= 8]
    theirs = ct2_search(translator, sentencepiece_vocabulary(out / TOKENIZER_NAME), sources, beam_size=1)
    assert np.mean([t == s for t, s in zip(theirs, sources)]) > 0.9  # int8 weights still copy


def test_vocabulary_size_mismatch_is_refused(tokenizer_file, tmp_path):
    model = Transformer(build_config("tiny", VOCAB + 1))
    with pytest.raises(CheckpointError, match="pieces"):
        export_ctranslate2(model, tokenizer_file, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
