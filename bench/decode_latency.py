"""One sentence at a time, the serving case: our decoder against CTranslate2 on the same weights,
and where our time goes.

Each of ``--sentences`` test sentences is translated alone (beam ``--beam``, alpha ``--alpha``, and
greedy), in-process, with ``--threads`` intra-op threads for both: (a) ours,
``pipeline.serving.translator.Translator`` (fp32, weights packed for oneDNN) and (b) CTranslate2
4.8 fp32 on ``python -m pipeline.serving.export ctranslate2`` of the same weights (its length
penalty is not GNMT's, so a few outputs differ). Latencies are the median of ``--rounds``
interleaved rounds per sentence, then p50/p95 over sentences.

The decoding settings default to what is served and scored: params.yaml's evaluate section with the
tune stage's choice on val (``reports/tune.json``) for beam size, alpha and stopping rule. Beside
them, ours with the other stopping rule (exact: a sentence stops once none of its live hypotheses
can beat the beam_size finished ones, even at the length limit; fairseq: once beam_size have
finished), with each rule's decoding steps per sentence against the length of what it returns.

Per step: both decoders forced to the same number of steps (ours to the length limit, CTranslate2
with min = max decoding length) on the first sentences, so that ms per step compare the same work
whatever each one's stopping rule.

The last line is ``ratio=<ours p50 / CTranslate2 p50>`` (beam; the serving issue's goal: at most 2).

    python bench/decode_latency.py --model models/model.pt --tokenizer data/tokenizer/spm.model
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ctranslate2
import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.config.loader import PARAMS
from pipeline.serving.decoding import STOPPING, DecodingConfig
from pipeline.serving.export import export_ctranslate2, sentencepiece_vocabulary
from pipeline.serving.translate import decoding_defaults
from pipeline.serving.translator import Translator
from transformer.checkpoint import load_model
from transformer.search import beam_search
from transformer.tokenizer import Tokenizer

Decode = Callable[[Sequence[int]], list[int]]
MATMUL = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul", "mkldnn", "aten::_mkldnn",
          "aten::_scaled_dot_product", "aten::scaled_dot_product")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latencies(decoders: dict[str, Decode], ids: list[list[int]], rounds: int) -> dict[str, list[float]]:
    """Per decoder, each sentence's median latency (ms) over ``rounds`` interleaved rounds."""
    for decode in decoders.values():
        for s in ids[:3]:
            decode(s)
    samples: dict[str, list[list[float]]] = {name: [[] for _ in ids] for name in decoders}
    for _ in range(rounds):
        for i, s in enumerate(ids):
            for name, decode in decoders.items():
                started = time.perf_counter()
                decode(s)
                samples[name][i].append((time.perf_counter() - started) * 1000)
    return {name: [statistics.median(x) for x in per] for name, per in samples.items()}


def count_steps(translator: Translator) -> list[int]:
    """A list that gets a 1 for every decoding step ``translator``'s model runs from now on."""
    steps: list[int] = []
    step = translator.model.decode_step

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        steps.append(1)
        return step(*args, **kwargs)

    translator.model.decode_step = counted
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/model.pt"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer/spm.model"))
    parser.add_argument("--data", type=Path, default=Path("data/corpus/test_2016_flickr.en"))
    parser.add_argument("--sentences", type=int, default=60)
    parser.add_argument("--params", type=Path, default=PARAMS)
    parser.add_argument("--beam", type=int, help="default: what the params file and the tune report serve")
    parser.add_argument("--alpha", type=float, help="default: what the params file and the tune report serve")
    parser.add_argument("--stopping", choices=STOPPING, help="default: what the params file and the tune report serve")
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--forced-steps", type=int, default=30, help="steps of the per-step comparison")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    served, source = decoding_defaults(args.params)
    for key, arg in (("beam_size", "beam"), ("alpha", "alpha"), ("stopping", "stopping")):
        if getattr(args, arg) is None:
            setattr(args, arg, served[key])
        else:
            source[key] = "the command line"
    other_rule = next(rule for rule in STOPPING if rule != args.stopping)
    for path in (args.model, args.tokenizer, args.data):
        if not path.is_file():
            parser.error(f"{path} does not exist: run the pipeline (make run) or name the files")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model).eval(), Tokenizer(args.tokenizer)
    lines = [line.rstrip("\n") for line, _ in zip(args.data.open(encoding="utf-8"), range(args.sentences))]
    ids = tokenizer.encode(lines)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {args.threads} thread(s); CTranslate2 "
          f"{ctranslate2.__version__}; {args.model} ({model.num_parameters():,} parameters); {len(ids)} sentences "
          f"of {args.data}, one at a time, beam {args.beam}, alpha {args.alpha}, stopping {args.stopping} (from "
          f"{source['beam_size']}; {source['alpha']}; {source['stopping']})")

    ours = Translator(model, tokenizer, DecodingConfig(beam_size=args.beam, alpha=args.alpha, stopping=args.stopping,
                                                       max_len_b=args.max_len_b, batch_sentences=1))
    steps = count_steps(ours)
    with tempfile.TemporaryDirectory() as workdir:
        export_ctranslate2(model, tokenizer.model_file, Path(workdir) / "ct2")
        vocab = sentencepiece_vocabulary(tokenizer.model_file)
        index = {piece: i for i, piece in enumerate(vocab)}
        ct2 = ctranslate2.Translator(str(Path(workdir) / "ct2"), device="cpu", compute_type="float32",
                                     intra_threads=args.threads, inter_threads=1)
        limit = min(args.max_len_b, model.config.max_positions - 1)

        def ctranslate2_decode(beam: int, forced: int = 0) -> Decode:
            def decode(s: Sequence[int]) -> list[int]:
                most = forced or min(len(s) + limit, model.config.max_positions - 1)
                r = ct2.translate_batch([[vocab[t] for t in s]], beam_size=beam, length_penalty=args.alpha,
                                        min_decoding_length=forced, max_decoding_length=most)
                return [index[p] for p in r[0].hypotheses[0]]
            return decode

        decoders: dict[str, Decode] = {
            "ours, beam": lambda s: ours.translate_ids([s])[0],
            f"ours, beam, {other_rule} stopping": lambda s: ours.translate_ids([s], stopping=other_rule)[0],
            "CTranslate2, beam": ctranslate2_decode(args.beam),
            "ours, greedy": lambda s: ours.translate_ids([s], beam_size=1)[0],
            "CTranslate2, greedy": ctranslate2_decode(1),
        }
        measured = latencies(decoders, ids, args.rounds)
        rules = {}
        for rule in STOPPING:
            steps.clear()
            outputs = [ours.translate_ids([s], stopping=rule)[0] for s in ids]
            rules[rule] = (outputs, sum(steps) / len(ids), statistics.mean(len(o) + 1 for o in outputs))
        same = sum(o == decoders["CTranslate2, beam"](s) for o, s in zip(rules[args.stopping][0], ids))
        # The same number of steps for both: ours searches to a length limit of exactly forced_steps
        # (max_len_b counts from the source length), CTranslate2 may neither stop sooner nor later.
        forced = args.forced_steps
        per_step = latencies({
            "ours": lambda s: beam_search(ours.model, ours.source_tensor([s]), beam_size=args.beam, alpha=args.alpha,
                                          max_len_b=forced - len(s) - 1, stopping="none").hypotheses[0],
            "CTranslate2": ctranslate2_decode(args.beam, forced),
        }, [s for s in ids[:10] if len(s) + 1 < forced], args.rounds)
    print("| decoder | p50 | p95 | mean |")
    print("|---|---:|---:|---:|")
    for name, values in measured.items():
        print(f"| {name} | {percentile(values, 0.5):.1f} ms | {percentile(values, 0.95):.1f} ms | "
              f"{statistics.mean(values):.1f} ms |")
    print(f"identical beam outputs: {same}/{len(ids)} (the length penalties differ)")
    for rule, (_, per_sentence, length) in rules.items():
        print(f"stopping {rule}: {per_sentence:.1f} decoding steps a sentence for outputs of {length:.1f} pieces "
              "(EOS counted)")
    shared = sum(a == b for a, b in zip(rules["exact"][0], rules["fairseq"][0]))
    print(f"outputs the two rules share: {shared}/{len(ids)}")
    ours_step, theirs_step = (statistics.median(per_step[name]) / forced for name in ("ours", "CTranslate2"))
    print(f"per step, both forced to {forced} steps (beam {args.beam}): ours {ours_step:.2f} ms, CTranslate2 "
          f"{theirs_step:.2f} ms ({ours_step / theirs_step:.2f}x)")

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for s in ids:
            decoders["ours, beam"](s)
        wall_ms = (time.perf_counter() - started) * 1000
    events = prof.key_averages()
    self_ms = {e.key: e.self_cpu_time_total / 1000 for e in events}
    calls = {e.key: e.count for e in events}
    in_ops = sum(self_ms.values())
    matmul = sum(ms for key, ms in self_ms.items() if key.startswith(MATMUL))
    steps = calls.get("aten::log_softmax", 0) or calls.get("aten::_log_softmax", 0)
    ops_per_step = sum(calls.values()) / steps if steps else float("nan")
    print(f"\nwhere ours spends one sentence's time (beam, profiled; the profiler itself adds overhead): wall "
          f"{wall_ms / len(ids):.1f} ms a sentence, {steps / len(ids):.1f} decoding steps, "
          f"{wall_ms / max(steps, 1):.2f} ms a step, {ops_per_step:.0f} operator events a step (nested ones counted)")
    print(f"  matrix products and attention kernels: {matmul / wall_ms:.0%}; other operators: "
          f"{(in_ops - matmul) / wall_ms:.0%}; outside operators (Python, dispatch): {1 - in_ops / wall_ms:.0%}")
    print("  operators by self time:")
    for key, ms in sorted(self_ms.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {key:<40} {ms / wall_ms:6.1%}  {calls[key] / max(steps, 1):6.1f} calls a step")
    ratio = percentile(measured["ours, beam"], 0.5) / percentile(measured["CTranslate2, beam"], 0.5)
    print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
