"""The GPU campaign's figures in one markdown page, read from its steps' logs and results.

    python -m bench.gpu.summary WORK > summary.md

``WORK`` is a part's folder (``bench/gpu_campaign.sh``): ``environment.txt``, ``steps.txt`` and a
folder per step with its ``command.txt`` and ``log.txt`` (and the recipes' ``results.json``). Each row
names its value, the issue's goal where it sets one, whether it was met, and the step it came from;
a step that did not run or did not finish says so instead of a figure.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

# The paper's big model (§5.2, Table 3): 300k updates of ~25000 target tokens, 3.5 days on 8 P100s.
PAPER_BIG_STEPS, PAPER_BATCH_TOKENS, PAPER_GPUS = 300_000, 25_000, 8
GOALS = {"tokens_per_second": 350_000, "mfu": 0.35, "ratio": 1.5, "test_bleu": 40.0, "train_minutes": 5.0}


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def number(pattern: str, text: str) -> float | None:
    found = re.findall(pattern, text, re.MULTILINE)
    return float(found[-1].replace(",", "")) if found else None


def steps(work: Path) -> dict[str, dict[str, int]]:
    out = {}
    for line in read(work / "steps.txt").splitlines():
        name, *fields = line.split()
        out[name] = {k: int(v) for k, v in (f.split("=") for f in fields)}
    return out


def status(work: Path, name: str) -> str:
    info = steps(work).get(name)
    if info is None:
        return "not run"
    if info["rc"] in (124, 137) or (info["rc"] in (130, -2) and info["seconds"] >= info["cap"]):
        return f"cut at its {info['cap']} s cap"
    return "ok" if info["rc"] == 0 else f"failed (exit {info['rc']})"


def met(value: float | None, goal: float, higher: bool = True) -> str:
    if value is None:
        return ""
    return "met" if (value >= goal if higher else value <= goal) else "missed"


def throughput_rows(work: Path, name: str, label: str) -> list[tuple[str, str, str, str]]:
    log = read(work / name / "log.txt")
    ours = number(r"^transformer package .*?: ([\d,]+) target tokens/s", log)
    ref = number(r"^reference torch\.nn\.Transformer .*?: ([\d,]+) target tokens/s", log)
    mfu, mfu_measured = number(r"^mfu=([\d.]+)", log), number(r"^mfu_measured_peak=([\d.]+)", log)
    ratio = number(r"^ratio=([\d.]+)", log)
    peak = re.findall(r"^bf16 matrix-product peak measured in this run: (.*)$", log, re.MULTILINE)
    memory = re.findall(r"^peak GPU memory while training.*?: (.*)$", log, re.MULTILINE)
    state = status(work, name)
    if ours is None:
        return [(f"{label}: target tokens/s", state, "", name)]
    rows = [(f"{label}: target tokens/s, ours", f"{ours:,.0f}", f">= {GOALS['tokens_per_second']:,}"
             f" ({met(ours, GOALS['tokens_per_second'])})", name)]
    if ref is not None:
        rows.append((f"{label}: target tokens/s, torch.nn.Transformer", f"{ref:,.0f}", "", name))
    if mfu is not None:
        rows.append((f"{label}: MFU of the data sheet's dense bf16 peak", f"{mfu:.3f}",
                     f">= {GOALS['mfu']} ({met(mfu, GOALS['mfu'])})", name))
    if mfu_measured is not None:
        rows.append((f"{label}: MFU of the bf16 peak measured in the run ({peak[-1] if peak else '?'})",
                     f"{mfu_measured:.3f}", "", name))
    if ratio is not None:
        rows.append((f"{label}: ours / torch.nn.Transformer", f"{ratio:.2f}",
                     f">= {GOALS['ratio']} ({met(ratio, GOALS['ratio'])})", name))
    if memory:
        rows.append((f"{label}: peak GPU memory", memory[-1], "", name))
    return rows


def big_rows(work: Path) -> list[tuple[str, str, str, str]]:
    rows = throughput_rows(work, "big", "big preset")
    ours = number(r"^transformer package .*?: ([\d,]+) target tokens/s", read(work / "big" / "log.txt"))
    if ours:
        one = PAPER_BIG_STEPS * PAPER_BATCH_TOKENS / ours / 3600
        rows.append(("big preset: the paper's 300k updates of 25k target tokens (estimate: this rate, perfect "
                     "scaling)", f"{one:,.0f} h on one GPU, {one / PAPER_GPUS:,.1f} h on {PAPER_GPUS}",
                     "paper: 3.5 days on 8 P100", "big"))
    return [r for r in rows if "torch.nn.Transformer" not in r[0]]


def recipe_rows(work: Path, name: str, label: str) -> list[tuple[str, str, str, str]]:
    file = work / name / "runs" / "results.json"
    if not file.is_file():
        return [(label, status(work, name), "", name)]
    results: dict[str, Any] = json.loads(file.read_text())
    rows = []
    for recipe, r in results["recipes"].items():
        chosen = results.get("chosen") == recipe
        tag = f"{label}, {recipe}" + (" (chosen on val)" if chosen else "")
        minutes = (r.get("train_seconds") or 0) / 60
        rows.append((f"{tag}: training", f"{r.get('steps')} updates, {r.get('epochs')} epochs, {minutes:.1f} min"
                     + (f" ({r['parameters']:,} parameters)" if r.get("parameters") else ""),
                     f"<= {GOALS['train_minutes']:g} min ({met(minutes, GOALS['train_minutes'], higher=False)})"
                     if chosen else "", name))
        if r.get("valid_bleu") is not None:
            rows.append((f"{tag}: val BLEU (beam {r.get('beam_size')}, alpha {r.get('alpha')}, "
                          f"stopping {r.get('stopping', 'exact')})",
                         f"{r['valid_bleu']:.2f}", "", name))
        for test_set, scores in (r.get("test") or {}).items():
            extra = "".join(f", {label} {scores[key]:.2f}" for key, label in
                            (("bleu_lc_tok", "the literature's lowercased tokenized BLEU"),) if key in scores)
            ci = f" ± {scores['bleu_ci95']:.2f}" if "bleu_ci95" in scores else ""
            rows.append((f"{tag}: test BLEU {test_set} (chrF {scores['chrf']:.2f}{extra})",
                         f"{scores['bleu']:.2f}{ci}",
                         f">= {GOALS['test_bleu']:g} ({met(scores['bleu'], GOALS['test_bleu'])})" if chosen else "",
                         name))
    for skipped in results.get("skipped", []):
        rows.append((f"{label}, {skipped}", "skipped: no time left in the step", "", name))
    if status(work, name) != "ok":
        rows.append((label, status(work, name), "", name))
    return rows


def decode_rows(work: Path) -> list[tuple[str, str, str, str]]:
    log = read(work / "decode" / "log.txt")
    found = re.findall(r"^(fp32|bf16) batch (\d+): ([\d,.]+) sentences/s .*BLEU ([\d.]+)", log, re.MULTILINE)
    if not found:
        return [("beam-4 decoding of the test set", status(work, "decode"), "", "decode")]
    head = re.findall(r"^(\S+): (\d+) sentences, beam (\d+), alpha ([\d.]+)", log, re.MULTILINE)
    what = f"{head[-1][1]} sentences of {head[-1][0]}, beam {head[-1][2]}" if head else "the test set"
    return [(f"decoding {what}, {precision}, batches of {batch}", f"{rate} sentences/s (BLEU {bleu})", "", "decode")
            for precision, batch, rate, bleu in found]


def profile_rows(work: Path, name: str) -> list[tuple[str, str, str, str]]:
    """``bench/gpu/profile_step.py``'s three timed lines (its profiler tables stay in the step's log)."""
    log = read(work / name / "log.txt")
    found = re.findall(r"^(1\. changing shapes|2\. one batch repeated|3\. one step in parts.*?): (.*)$", log,
                       re.MULTILINE)
    if not found:
        return [(f"{name}: a step's time", status(work, name), "", name)]
    return [(f"{name}: {label}", value, "", name) for label, value in found]


def step_bench_rows(work: Path, name: str, label: str) -> list[tuple[str, str, str, str]]:
    """``bench/train_step.py``: each variant's target tokens/s and the ratios it printed."""
    log = read(work / name / "log.txt")
    speeds = re.findall(r"^ *(\w+)(?: \(.*?\))?: ([\d,]+) target tokens/s", log, re.MULTILINE)
    ratios = re.findall(r"^(\w+_ratio)=([\d.]+)$", log, re.MULTILINE)
    if not speeds:
        return [(f"{label}: the trainer's step", status(work, name), "", name)]
    rows = [(f"{label}: {variant}", f"{value} target tokens/s", "", name) for variant, value in speeds]
    return rows + [(f"{label}: {ratio}", value, "", name) for ratio, value in ratios]


def main() -> None:
    work = Path(sys.argv[1])
    env = read(work / "environment.txt")
    print(f"# GPU campaign, {work.name}\n")
    print("```\n" + env.strip() + "\n```\n")
    rows: list[tuple[str, str, str, str]] = []
    if (work / "gpu_tests").is_dir():
        log = read(work / "gpu_tests" / "log.txt")
        tail = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)", line)]
        outcome = tail[-1].strip("= ") if tail else status(work, "gpu_tests")
        rows.append(("tests/gpu (a skip counts as a failure)", outcome, "all pass", "gpu_tests"))
    if (work / "throughput_base_eager").is_dir():
        rows += throughput_rows(work, "throughput_base_eager", "base, bf16, eager")
    if (work / "throughput_base_compiled").is_dir():
        rows += throughput_rows(work, "throughput_base_compiled", "base, bf16, torch.compile")
    if (work / "big").is_dir():
        rows += big_rows(work)
    if (work / "multi30k_default").is_dir():
        rows += recipe_rows(work, "multi30k_default", "Multi30k, params.yaml")
    for name in ("profile_base", "profile_base_expandable", "profile_big"):
        if (work / name).is_dir():
            rows += profile_rows(work, name)
    for name, label in (("levers_base", "base, bf16, trainer step"), ("compiled_base", "base, bf16, trainer step"),
                        ("big_step", "big, bf16, trainer step")):
        if (work / name).is_dir():
            rows += step_bench_rows(work, name, label)
    if (work / "decode").is_dir():
        rows += decode_rows(work)
    if (work / "multi30k_gpu").is_dir():
        rows += recipe_rows(work, "multi30k_gpu", "Multi30k, GPU candidates")
    print("| figure | value | goal | step |\n|---|---|---|---|")
    for figure, value, goal, step in rows:
        print(f"| {figure} | {value} | {goal} | `{step}` |")
    print("\nSteps (exit code, seconds, cap):\n")
    for name, info in steps(work).items():
        command = read(work / name / "command.txt").strip()
        print(f"- `{name}`: {status(work, name)}, {info['seconds']} s of {info['cap']}: `{command}`")


if __name__ == "__main__":
    main()
