"""The CTranslate2 export (pipeline/serving/export.py) computes what our model computes.

Random weights check the numbers: CTranslate2's teacher-forced log-probabilities equal
ours for every configuration (post-LN/pre-LN, ReLU/GELU, learned positions, untied
embeddings). Tiny models trained to copy (post-LN ReLU and pre-LN GELU) check decoding:
CTranslate2's greedy search returns the token ids of ``transformer.search.greedy_search``, its beam 4
those of ``transformer.search.beam_search`` where both are the same search (no length penalty), and
a sentence's CTranslate2 translation does not depend on the others in its batch.
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

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.ct2_translator import CT2Translator
from pipeline.serving.export import TOKENIZER_NAME, export_ctranslate2, main, sentencepiece_vocabulary
from transformer.checkpoint import CheckpointError, model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import open_tokenizer, train_tokenizer
from transformer.tokens import BOS_ID, EOS_ID, PAD_ID
from transformer.training.token_store import write_token_store
from transformer.training.trainer import TrainConfig, Trainer

pytestmark = pytest.mark.fast

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


@pytest.mark.training
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


# CTranslate2 4.x has no ``allow_early_exit`` option any more (removed in 3.0): it exits early, when its
# best candidate ends, exactly when no penalty is set (length_penalty 0), and otherwise stops once
# beam_size hypotheses have finished (patience 1), fairseq's rule. So length_penalty 0 (early exit on)
# is ours with alpha 0 and stopping "exact" (with no penalty a finished best candidate is the exact
# result), and length_penalty 1e-6 (early exit off; |Y| ** 1e-6 reorders none of these scores) is ours
# with alpha 0 and stopping "fairseq".
EQUAL_SEARCHES = [("exact", 0.0), ("fairseq", 1e-6)]
TIE = 1e-4   # log-probabilities this close are one value computed in two orders (float32, two engines)


def log_probability(model: Transformer, source: list[int], hypothesis: list[int], max_len_b: int = 50) -> float:
    """log P(hypothesis, EOS | source) under our model; a hypothesis cut at the length limit has no EOS."""
    target = hypothesis if len(hypothesis) >= len(source) + max_len_b else [*hypothesis, EOS_ID]
    with torch.no_grad():
        lprobs = torch.log_softmax(model(pad([source]), pad([[BOS_ID, *target[:-1]]], end=()))[0], -1)
    return float(lprobs[torch.arange(len(target)), torch.tensor(target)].sum())


@pytest.mark.parametrize("stopping, length_penalty", EQUAL_SEARCHES, ids=["exact-vs-early-exit", "fairseq-vs-patience"])
@pytest.mark.parametrize("name", TRAINED)
def test_beam_4_equals_ctranslate2_without_length_penalty(name, stopping, length_penalty, trained, tokenizer_file,
                                                          tmp_path, capsys):
    """Beam 4, float32, the probes in and out of distribution (about half of those out of it are no
    copies, several run to the length limit): every hypothesis equal, or a numerical tie (two
    hypotheses whose log-probabilities under our model differ by at most ``TIE``), counted."""
    model = trained(name)
    sources = probe_sources()
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    ours = beam_search(model, pad(sources), beam_size=4, alpha=0.0, stopping=stopping).hypotheses
    theirs = ct2_search(translator, vocab, sources, beam_size=4, length_penalty=length_penalty)
    ties, real = 0, []
    for source, o, t in zip(sources, ours, theirs):
        if o != t:
            gap = abs(log_probability(model, source, o) - log_probability(model, source, t))
            ties += gap <= TIE
            real += [(source, o, t, gap)] if gap > TIE else []
    at_limit = sum(len(h) == len(s) + 50 for h, s in zip(ours, sources))
    with capsys.disabled():
        print(f"\n[{name}, {stopping} / length_penalty {length_penalty:g}] beam 4 on {len(sources)} sources: "
              f"{len(sources) - ties - len(real)} equal, {ties} numerical ties; {at_limit} at the length limit")
    assert not real, f"{len(real)} differ, e.g. {real[:2]}"
    assert ties <= len(sources) // 20


@pytest.mark.parametrize("name", TRAINED)
def test_beam_agreement_at_the_served_settings_is_reported(name, trained, tokenizer_file, tmp_path, capsys):
    """With a penalty the searches differ: ours scores a finished hypothesis log P / ((5 + |Y|) / 6) **
    alpha (GNMT, |Y| counting EOS), CTranslate2 divides by |Y| ** length_penalty. Reported, not
    required; confident copies must still agree."""
    model = trained(name)
    sources = probe_sources()
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    theirs = ct2_search(translator, vocab, sources, beam_size=4, length_penalty=0.6)
    agreement = {stopping: [o == t for o, t in zip(
        beam_search(model, pad(sources), beam_size=4, alpha=0.6, stopping=stopping).hypotheses, theirs)]
        for stopping in ("exact", "fairseq")}
    with capsys.disabled():
        print(f"\n[{name}] beam 4, alpha = length_penalty = 0.6, agreement with CTranslate2 on {len(sources)} "
              f"sources: " + ", ".join(f"{stop} {np.mean(same):.1%}" for stop, same in agreement.items()))
    in_dist = [same for same, s in zip(agreement["fairseq"], sources) if 4 <= len(s) <= 8]
    assert np.mean(in_dist) > 0.9


def test_a_sentence_translates_the_same_alone_and_in_any_batch(trained, tokenizer_file, tmp_path):
    """``CT2Translator.translate_ids``: one call holding every probe (14 length limits) gives each
    sentence what it gets alone. With one ``max_decoding_length`` for the call (the longest's), a
    short sentence's hypotheses ran past its own limit and were cut after, which changed the winner."""
    model = trained("post-ln-relu")
    sources = probe_sources()
    translator, vocab = export(model, tokenizer_file, tmp_path / "ct2")
    decoding = DecodingConfig(engine="ctranslate2", beam_size=4, alpha=0.0, stopping="fairseq", max_len_b=1,
                              batch_sentences=32, compute_type="float32")
    ct2 = CT2Translator(translator, open_tokenizer(tokenizer_file), vocab, decoding, model.config.max_positions)
    together = ct2.translate_ids(sources)
    alone = [ct2.translate_ids([s])[0] for s in sources]
    assert sum(len(a) == len(s) + 1 for a, s in zip(alone, sources)) >= 5   # several end at their own limit
    changed = [(s, t, a) for s, t, a in zip(sources, together, alone) if t != a]
    assert not changed, f"{len(changed)} of {len(sources)} changed with the batch, e.g. {changed[:2]}"


@pytest.mark.training
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
