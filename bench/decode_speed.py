"""Decoding speed: our cached beam search against a cache-free one and against CTranslate2.

Four decoders translate the same source sentences with beam 4 (§6.1) on the same weights:

(a) ours: ``transformer.search.beam_search``, batched, with the decoder's key/value cache
    (one new position per hypothesis and step), through ``pipeline.serving.translator.Translator``
    (weights packed once for oneDNN, ``transformer.packed``), fp32, and with bf16 weights;
(b) naive: the reference of ``ratio=``. The same search and batching on the plain eager model
    (the package's ``nn.Linear`` layers, as trained: ``packed=False``), but every step re-runs
    ``model.decode`` without a cache on the whole target prefix (and, as ``model.decode`` does,
    projects every position onto the vocabulary); the encoder still runs once per batch. It is
    the decoder one writes from the model alone, like the training bench's eager reference;
(b') naive, packed weights: (b) on (a)'s packed weights. Same algorithm, same kernels, same
    outputs (up to float rounding): ours against it isolates what the cache saves;
(c) CTranslate2 fp32 (``compute_type="float32"``) on the export of the same weights
    (``pipeline.serving.export``), with as many intra-op threads as torch uses (``--threads``). Its length penalty
    is |Y| ** lp rather than GNMT's ((5 + |Y|) / 6) ** alpha, so a few outputs may differ.

Speed is target tokens (hypothesis + EOS) per second, the median of ``--rounds`` interleaved
rounds. The floating-point work of (a) and (b) is then counted once (``FlopCounterMode``, plain
layers): its ratio is what the cache saves, and so the most that ours against (b') can reach on
these sentences if both ran their matrix products equally fast (the naive one's are larger, so
faster). ``ratio=`` is ours against (b): the cache's saving times what packing the weights
gains, both printed.

The model is ``--model`` and ``--tokenizer`` when both exist; otherwise the ``small``
preset trained for ``--train-seconds`` on Multi30k En-De (tokenizer trained first); otherwise a
randomly initialised ``small`` model whose EOS embedding is zeroed so that every output runs to
the length limit (a fixed length for the fixed-length synthetic sources), which is said in the
output. The sources are the first ``--sentences`` lines of ``--data`` (default: the pipeline's
``data/corpus/test_2016_flickr.en``, else the Multi30k mirror's), else synthetic ids: the
output says which. The last two lines are ``ours_vs_ctranslate2=<x>`` and ``ratio=<ours / naive>``.

    python bench/decode_speed.py [--sentences 200] [--train-seconds 60] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.export import build_spec, export_ctranslate2, sentencepiece_vocabulary
from pipeline.serving.translator import Translator
from transformer.checkpoint import load_model
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer, train_tokenizer
from transformer.tokens import EOS_ID
from transformer.training.token_store import write_token_store
from transformer.training.trainer import TrainConfig, Trainer

# The Multi30k mirror: DATA_MIRROR, else ../shared/data/multi30k beside the repository.
MULTI30K = Path(os.environ.get("DATA_MIRROR") or Path(__file__).resolve().parents[2] / "shared/data/multi30k") \
    / "data/task1/raw"


class PrefixCache:
    """Stands in for ``DecoderCache``: keeps the whole target prefix instead of keys and values."""

    def __init__(self) -> None:
        self.prefix: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.prefix is None else self.prefix.size(1)

    def append(self, tokens: Tensor) -> Tensor:
        self.prefix = tokens if self.prefix is None else torch.cat([self.prefix, tokens], dim=1)
        return self.prefix


class NaiveDecoder(nn.Module):
    """``model`` with a cache-free ``decode``: each step re-runs the decoder on the whole prefix.

    It keeps ``Transformer``'s decoding contract (what the search calls), on a ``PrefixCache``."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src)

    def new_cache(self) -> PrefixCache:
        return PrefixCache()

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: PrefixCache) -> Tensor:
        return self.model.decode(cache.append(tgt), memory, src_mask)[:, -1:]

    def decode_step(self, tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: PrefixCache) -> Tensor:
        return torch.log_softmax(self.decode(tokens, memory, src_mask, cache)[:, -1].float(), dim=-1)

    def reorder_cache(self, cache: PrefixCache, order: Tensor) -> None:
        cache.prefix = cache.prefix.index_select(0, order)

    def select_sentences(self, memory: Tensor, src_mask: Tensor, sentences: Tensor,
                         cache: PrefixCache | None = None) -> tuple[Tensor, Tensor]:
        return memory[sentences], src_mask[sentences]  # memory is passed anew at every step


def train_small(seconds: float, workdir: Path) -> tuple[Transformer, Tokenizer]:
    """``small`` trained for ``seconds`` on Multi30k En-De with a fresh 8000-piece tokenizer."""
    read = lambda name: gzip.open(MULTI30K / name, "rt", encoding="utf-8").read().splitlines()
    en, de = read("train.en.gz"), read("train.de.gz")
    tokenizer = train_tokenizer(en + de, workdir / "spm.model", vocab_size=8000)
    store = write_token_store(workdir / "train", zip(tokenizer.encode(en), tokenizer.encode(de)),
                              vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    model = Transformer(build_config("small", tokenizer.vocab_size))
    config = TrainConfig(max_tokens=2048, warmup_steps=100, max_minutes=seconds / 60, checkpoint_every_steps=0,
                         log_every=10_000, precision="fp32", device="cpu")
    Trainer(model, config, store).train()
    return model.eval(), tokenizer


def load(args: argparse.Namespace, workdir: Path) -> tuple[Transformer, Tokenizer | None, str]:
    """The model, its tokenizer (None for the random fallback) and a line saying which it is."""
    if args.model.is_file() and args.tokenizer.is_file():
        return load_model(args.model).eval(), Tokenizer(args.tokenizer), f"model: {args.model}"
    if args.train_seconds > 0 and (MULTI30K / "train.en.gz").is_file():
        started = time.perf_counter()
        model, tokenizer = train_small(args.train_seconds, workdir)
        return model, tokenizer, (f"model: small preset trained {time.perf_counter() - started:.0f} s "
                                  f"on Multi30k En-De (no {args.model})")
    torch.manual_seed(0)
    model = Transformer(build_config("small", 8000)).eval()
    with torch.no_grad():
        model.output.weight[EOS_ID] = 0.0  # EOS logit 0, far below the best: outputs run to the limit
    return model, None, "model: RANDOM small preset, EOS disabled: every output has the maximum length"


def sources(args: argparse.Namespace, tokenizer: Tokenizer | None) -> tuple[list[list[int]], str]:
    """The first ``--sentences`` sentences of ``--data`` as ids, or synthetic 14-piece ids, and
    a line saying which."""
    if tokenizer is not None and args.data.is_file():
        with (gzip.open if args.data.suffix == ".gz" else open)(args.data, "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line, _ in zip(f, range(args.sentences))]
        return tokenizer.encode(lines), f"sources: {args.data}"
    g = torch.Generator().manual_seed(0)
    why = "no tokenizer" if tokenizer is None else f"no {args.data}: set DATA_MIRROR"
    return (torch.randint(4, 8000, (args.sentences, 14), generator=g).tolist(),
            f"sources: SYNTHETIC random ids ({why}); outputs and ratios are not those of real sentences")


Decoder = Callable[[Sequence[Sequence[int]]], list[list[int]]]


def timed(decoders: dict[str, Decoder], ids: list[list[int]], rounds: int
          ) -> dict[str, tuple[list[list[int]], float]]:
    """Per decoder: its outputs and its median target tokens per second (hypotheses + EOS) over
    ``rounds`` interleaved rounds (a slow spell of a shared machine hits every decoder), after a
    small warm-up."""
    speeds: dict[str, list[float]] = {name: [] for name in decoders}
    outputs: dict[str, list[list[int]]] = {}
    for decode in decoders.values():
        decode(ids[:8])
    for _ in range(rounds):
        for name, decode in decoders.items():
            started = time.perf_counter()
            outputs[name] = decode(ids)
            speeds[name].append(sum(len(h) + 1 for h in outputs[name]) / (time.perf_counter() - started))
    return {name: (outputs[name], float(np.median(speeds[name]))) for name in decoders}


def floating_point_work(model: nn.Module, tokenizer: Tokenizer | None, ids: list[list[int]], options: dict) -> float:
    """Floating-point operations of translating ``ids`` (matrix products, attention included), as
    counted by PyTorch on the plain (unpacked) layers."""
    translator = Translator(model, tokenizer, DecodingConfig(**options), packed=False)
    with FlopCounterMode(display=False) as counter:
        translator.translate_ids(ids)
    return float(counter.get_total_flops())


def ctranslate2_decoder(model: Transformer, tokenizer: Tokenizer | None, workdir: Path, args: argparse.Namespace
                        ) -> Callable[[Sequence[Sequence[int]]], list[list[int]]]:
    """CTranslate2 beam search on ``model``'s weights exported with ``pipeline.serving.export``."""
    path = workdir / "ct2"
    if tokenizer is not None:
        export_ctranslate2(model, tokenizer.model_file, path)
        vocab = sentencepiece_vocabulary(tokenizer.model_file)
    else:  # random fallback: no tokenizer, the pieces are only names for the ids
        vocab = ["<pad>", "<unk>", "<s>", "</s>", *(f"t{i}" for i in range(4, model.config.vocab_size))]
        spec = build_spec(model, vocab)
        spec.optimize()
        path.mkdir()
        spec.save(str(path))
    translator = ctranslate2.Translator(str(path), device="cpu", compute_type="float32",
                                        intra_threads=torch.get_num_threads(), inter_threads=1)
    index = {piece: i for i, piece in enumerate(vocab)}
    limit = min(args.max_len_b, model.config.max_positions - 1)

    def decode(ids: Sequence[Sequence[int]]) -> list[list[int]]:
        results = translator.translate_batch(
            [[vocab[t] for t in s] for s in ids], max_batch_size=args.batch_sentences, beam_size=args.beam,
            length_penalty=args.alpha, min_decoding_length=0,
            max_decoding_length=min(max(len(s) for s in ids) + limit, model.config.max_positions - 1))
        return [[index[p] for p in r.hypotheses[0]] for r in results]
    return decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/model.pt"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer/spm.model"))
    parser.add_argument("--data", type=Path, default=None,
                        help="source sentences, plain or .gz (default: the pipeline's data/corpus/"
                             "test_2016_flickr.en, else the Multi30k mirror's)")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--train-seconds", type=float, default=60.0)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--batch-sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median taken)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch and CTranslate2 intra-op threads (default 1: on a small shared machine "
                             "a second thread is often contended and makes timings erratic)")
    args = parser.parse_args()
    if args.data is None:
        corpus = Path("data/corpus/test_2016_flickr.en")
        args.data = corpus if corpus.is_file() else MULTI30K / "test_2016_flickr.en.gz"
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="decode_speed.") as tmp:
        workdir = Path(tmp)
        model, tokenizer, what = load(args, workdir)
        ids, which = sources(args, tokenizer)
        print(what)
        print(which)
        print(f"{len(ids)} sentences, beam {args.beam}, {torch.get_num_threads()} threads, "
              f"{sum(map(len, ids)) / len(ids):.1f} source pieces each")
        options = dict(beam_size=args.beam, alpha=args.alpha, max_len_b=args.max_len_b,
                       batch_sentences=args.batch_sentences)
        results = timed({
            "ours": Translator(model, tokenizer, DecodingConfig(**options)).translate_ids,
            "ours_bf16": Translator(model, tokenizer, DecodingConfig(**options, precision="bf16")).translate_ids,
            "naive": Translator(NaiveDecoder(model), tokenizer, DecodingConfig(**options), packed=False).translate_ids,
            "naive_packed": Translator(NaiveDecoder(model), tokenizer, DecodingConfig(**options)).translate_ids,
            "ct2": ctranslate2_decoder(model, tokenizer, workdir, args),
        }, ids, args.rounds)
        ((ours, ours_speed), (ours_bf16, bf16_speed), (naive, naive_speed), (naive_packed, packed_speed),
         (ct2, ct2_speed)) = results.values()
        ours_work, naive_work = (floating_point_work(m, tokenizer, ids, options) for m in (model, NaiveDecoder(model)))

    same = lambda other: sum(a == b for a, b in zip(ours, other)) / len(ours)
    print(f"ours (KV cache)       {ours_speed:9.1f} target tokens/s  "
          f"mean output {sum(map(len, ours)) / len(ours):.1f} pieces")
    print(f"ours bf16 weights     {bf16_speed:9.1f} target tokens/s  same outputs as ours: {same(ours_bf16):.1%}")
    print(f"naive (no cache)      {naive_speed:9.1f} target tokens/s  same outputs as ours: {same(naive):.1%}  "
          f"(plain eager layers: the reference of ratio=)")
    print(f"naive, packed weights {packed_speed:9.1f} target tokens/s  same outputs as ours: {same(naive_packed):.1%}")
    print(f"CTranslate2 fp32      {ct2_speed:9.1f} target tokens/s  same outputs as ours: {same(ct2):.1%}")
    saved = naive_work / ours_work
    print(f"work (FLOPs)           ours {ours_work / 1e9:.1f} G, naive {naive_work / 1e9:.1f} G: the cache saves "
          f"{saved:.2f}x, the ceiling of ours against the naive decoder on the same packed weights")
    print(f"ratio = cache x packing: ours / naive packed {ours_speed / packed_speed:.2f} "
          f"({ours_speed / packed_speed / saved:.0%} of {saved:.2f}) x naive packed / naive "
          f"{packed_speed / naive_speed:.2f}")
    print(f"ours_bf16_vs_ctranslate2_fp32={bf16_speed / ct2_speed:.3f}")
    print(f"ours_vs_ctranslate2={ours_speed / ct2_speed:.3f}")
    print(f"ratio={ours_speed / naive_speed:.3f}")


if __name__ == "__main__":
    main()
