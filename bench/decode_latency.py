"""One sentence at a time, the serving case, each engine side by side on the same weights: ours
(our PyTorch search), ours through CTranslate2 (``CT2Translator``, what the server and the stages
decode with when the engine is ctranslate2) and raw CTranslate2 (``translate_batch`` of the same
``ctranslate2.Translator`` directly); and where our search's time goes.

Each of ``--sentences`` test sentences is translated alone, in-process, with ``--threads`` threads
(torch's intra-op threads; CTranslate2's ``intra_threads``, one replica), at each engine's served
settings and greedy: (a) ours, ``pipeline.serving.translator.Translator`` (fp32, weights packed for
oneDNN), (b) ``CT2Translator`` and (c) raw ``translate_batch`` with the options (b) passes (so that
(b) - (c) is what our wrapper adds: tokens to pieces and back, the length limit), both at the
served compute type on ``python -m pipeline.serving.export ctranslate2`` of the same weights.
Latencies are the median of ``--rounds`` rounds per sentence, then p50/p95 over
sentences.

The decoding settings default to what is served and scored, each engine's own: params.yaml's
evaluate section with the tune stage's choice on val (``reports/tune.json``, and for the engine it
did not choose, that engine's own chosen point in ``reports/tune/scores.json``) for beam size,
alpha, stopping rule and compute type; their alphas differ (GNMT's penalty against CTranslate2's
|Y|^alpha). Beside them, ours with the other stopping rule (exact: a sentence stops once none of
its live hypotheses can beat the beam_size finished ones, even at the length limit; fairseq: once
beam_size have finished), with each rule's decoding steps per sentence against the length of what
it returns.

Per step: ours and raw CTranslate2 forced to the same number of steps at the same beam (ours to the
length limit, CTranslate2 with min = max decoding length) on the first sentences, so that ms per
step compare the same work whatever each one's stopping rule (``CT2Translator`` adds per call, not
per step).

The last lines are ``wrapper=<(b) p50 / (c) p50>`` and ``ratio=<(a) p50 / (c) p50>`` (beam).

    python bench/decode_latency.py --model models/model.pt --tokenizer data/tokenizer/spm.model
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ctranslate2
import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.config.decoding import COMPUTE_TYPES, STOPPING, DecodingConfig
from pipeline.config.errors import ParamsError
from pipeline.config.loader import PARAMS
from pipeline.serving.ct2_translator import load_ct2_translator
from pipeline.serving.export import export_ctranslate2
from pipeline.serving.translate import decoding_defaults
from pipeline.serving.translator import Translator
from transformer.checkpoint import load_model
from transformer.search import beam_search
from transformer.tokenizer import Tokenizer

Decode = Callable[[Sequence[int]], list[int]]
MATMUL = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul", "mkldnn", "aten::_mkldnn",
          "aten::_scaled_dot_product", "aten::scaled_dot_product")


def cpu_name() -> str:
    """The CPU's model name and whether it has bf16 units (AVX512-BF16, AMX): the figures depend on both."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                "unknown CPU")
    units = [label for flag, label in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX")) if flag in text]
    return f"{name}{' with ' + ' and '.join(units) if units else ''}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latencies(decoders: dict[str, Decode], ids: list[list[int]], rounds: int) -> dict[str, list[float]]:
    """Per decoder, each sentence's median latency (ms) over ``rounds`` rounds. In a round each
    decoder translates every sentence in a row, in an order rotated from round to round: one after
    another sentence by sentence, each would find its weights pushed out of the caches by the one
    before (measured: ours through CTranslate2 at 1.84x raw CTranslate2's p50 when each sentence
    went through every decoder in turn, right after ours; 1.08x in rows), which a server decoding
    with one engine never does."""
    for decode in decoders.values():
        for s in ids[:3]:
            decode(s)
    samples: dict[str, list[list[float]]] = {name: [[] for _ in ids] for name in decoders}
    names = list(decoders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            decode = decoders[name]
            decode(ids[0])   # its weights back in the caches
            for i, s in enumerate(ids):
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


def served(params: Path, engine: str) -> tuple[dict[str, Any], str]:
    """``engine``'s served settings and where they come from, in a few words; the paper's, said so,
    where the tune stage chose no point of that engine."""
    try:
        settings, source = decoding_defaults(params, engine=engine)
    except ParamsError as err:
        paper = DecodingConfig(engine=engine, stopping="fairseq" if engine == "ctranslate2" else "exact").to_dict()
        return paper, f"the paper's: {str(err).split(':')[0]}"
    return settings, f"{source['alpha']}"


def overridden(settings: dict[str, Any], asked: dict[str, Any], source: str) -> str:
    """``settings`` updated with what the command line ``asked`` (None: not asked); their source."""
    asked = {k: v for k, v in asked.items() if v is not None}
    settings.update(asked)
    return f"the command line for {', '.join(asked)}, else {source}" if asked else source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/model.pt"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer/spm.model"))
    parser.add_argument("--data", type=Path, default=Path("data/corpus/test_2016_flickr.en"))
    parser.add_argument("--sentences", type=int, default=60)
    parser.add_argument("--params", type=Path, default=PARAMS)
    parser.add_argument("--beam", type=int, help="both engines' beam (default: each one's served)")
    parser.add_argument("--alpha", type=float, help="ours' alpha (default: served)")
    parser.add_argument("--ct2-alpha", type=float, help="CTranslate2's alpha, its own penalty (default: served)")
    parser.add_argument("--stopping", choices=STOPPING, help="ours' stopping rule (default: served)")
    parser.add_argument("--compute-type", choices=COMPUTE_TYPES, help="CTranslate2's (default: served)")
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--forced-steps", type=int, default=30, help="steps of the per-step comparison")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    (t, t_from), (c, c_from) = served(args.params, "torch"), served(args.params, "ctranslate2")
    t_from = overridden(t, {"beam_size": args.beam, "alpha": args.alpha, "stopping": args.stopping}, t_from)
    c_from = overridden(c, {"beam_size": args.beam, "alpha": args.ct2_alpha, "compute_type": args.compute_type},
                        c_from)
    other_rule = next(rule for rule in STOPPING if rule != t["stopping"])
    for path in (args.model, args.tokenizer, args.data):
        if not path.is_file():
            parser.error(f"{path} does not exist: run the pipeline (make run) or name the files")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model).eval(), Tokenizer(args.tokenizer)
    lines = [line.rstrip("\n") for line, _ in zip(args.data.open(encoding="utf-8"), range(args.sentences))]
    ids = tokenizer.encode(lines)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {args.threads} thread(s); CTranslate2 "
          f"{ctranslate2.__version__} {c['compute_type']}, 1 x {args.threads} thread(s); {args.model} "
          f"({model.num_parameters():,} parameters); {len(ids)} sentences of {args.data}, one at a time")
    print(f"ours: beam {t['beam_size']}, alpha {t['alpha']}, stopping {t['stopping']} (from {t_from}); "
          f"CTranslate2: beam {c['beam_size']}, alpha {c['alpha']}, {c['compute_type']} (from {c_from})")

    ours = Translator(model, tokenizer, DecodingConfig(beam_size=t["beam_size"], alpha=t["alpha"],
                                                       stopping=t["stopping"], max_len_b=args.max_len_b,
                                                       batch_sentences=1))
    steps = count_steps(ours)
    with tempfile.TemporaryDirectory() as workdir:
        exported = export_ctranslate2(model, tokenizer.model_file, Path(workdir) / "ct2")
        via = load_ct2_translator(exported, tokenizer.model_file, DecodingConfig(
            beam_size=c["beam_size"], alpha=c["alpha"], stopping="fairseq", engine="ctranslate2",
            compute_type=c["compute_type"], max_len_b=args.max_len_b, batch_sentences=1),
            model.config.max_positions, threads=(1, args.threads))
        limit = min(args.max_len_b, model.config.max_positions - 1)

        def raw(beam: int, forced: int = 0) -> Decode:
            """``translate_batch`` of the same engine with the options ``CT2Translator`` passes."""
            def decode(s: Sequence[int]) -> list[int]:
                own = min(len(s) + limit, model.config.max_positions - 1)
                most = forced or via.bucket(own)   # the rounded limit CT2Translator decodes with, then its own
                r = via.engine.translate_batch([[via.vocabulary[t] for t in s]], beam_size=beam,
                                               length_penalty=c["alpha"], min_decoding_length=forced,
                                               max_decoding_length=most, max_input_length=0,
                                               suppress_sequences=via.suppressed)
                hypothesis = [via.index[p] for p in r[0].hypotheses[0]]
                return hypothesis if forced else hypothesis[:own]
            return decode

        decoders: dict[str, Decode] = {
            "ours, beam": lambda s: ours.translate_ids([s])[0],
            f"ours, beam, {other_rule} stopping": lambda s: ours.translate_ids([s], stopping=other_rule)[0],
            "ours through CTranslate2, beam": lambda s: via.translate_ids([s])[0],
            "raw CTranslate2, beam": raw(c["beam_size"]),
            "ours, greedy": lambda s: ours.translate_ids([s], beam_size=1)[0],
            "ours through CTranslate2, greedy": lambda s: via.translate_ids([s], beam_size=1)[0],
            "raw CTranslate2, greedy": raw(1),
        }
        measured = latencies(decoders, ids, args.rounds)
        rules = {}
        for rule in STOPPING:
            steps.clear()
            outputs = [ours.translate_ids([s], stopping=rule)[0] for s in ids]
            rules[rule] = (outputs, sum(steps) / len(ids), statistics.mean(len(o) + 1 for o in outputs))
        through = [via.translate_ids([s])[0] for s in ids]
        same_raw = sum(o == decoders["raw CTranslate2, beam"](s) for o, s in zip(through, ids))
        same = sum(o == h for o, h in zip(rules[t["stopping"]][0], through))
        # The same number of steps for both, at ours' beam: ours searches to a length limit of exactly
        # forced_steps (max_len_b counts from the source length), CTranslate2 may neither stop sooner nor later.
        forced = args.forced_steps
        per_step = latencies({
            "ours": lambda s: beam_search(ours.model, ours.source_tensor([s]), beam_size=t["beam_size"],
                                          alpha=t["alpha"], max_len_b=forced - len(s) - 1,
                                          stopping="none").hypotheses[0],
            "CTranslate2": raw(t["beam_size"], forced),
        }, [s for s in ids[:10] if len(s) + 1 < forced], args.rounds)
    print("| decoder | p50 | p95 | mean |")
    print("|---|---:|---:|---:|")
    for name, values in measured.items():
        print(f"| {name} | {percentile(values, 0.5):.1f} ms | {percentile(values, 0.95):.1f} ms | "
              f"{statistics.mean(values):.1f} ms |")
    print(f"identical beam outputs, ours through CTranslate2 and raw: {same_raw}/{len(ids)}; ours and CTranslate2: "
          f"{same}/{len(ids)} (their length penalties differ)")
    for rule, (_, per_sentence, length) in rules.items():
        print(f"stopping {rule}: {per_sentence:.1f} decoding steps a sentence for outputs of {length:.1f} pieces "
              "(EOS counted)")
    shared = sum(a == b for a, b in zip(rules["exact"][0], rules["fairseq"][0]))
    print(f"outputs the two rules share: {shared}/{len(ids)}")
    ours_step, theirs_step = (statistics.median(per_step[name]) / forced for name in ("ours", "CTranslate2"))
    print(f"per step, both forced to {forced} steps (beam {t['beam_size']}): ours {ours_step:.2f} ms, raw "
          f"CTranslate2 {c['compute_type']} {theirs_step:.2f} ms ({ours_step / theirs_step:.2f}x)")

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
    p50 = {name: percentile(values, 0.5) for name, values in measured.items()}
    print(f"wrapper={p50['ours through CTranslate2, beam'] / p50['raw CTranslate2, beam']:.2f}")
    print(f"ratio={p50['ours, beam'] / p50['raw CTranslate2, beam']:.2f}")


if __name__ == "__main__":
    main()
