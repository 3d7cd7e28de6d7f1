"""bench/train_throughput.py runs end to end on one short round and prints what it measured,
``ratio=`` last. Speeds are printed, never asserted."""

import re

import pytest

from tests.bench import run_bench


def test_train_bench_runs_and_prints_both_speeds_and_their_ratio(tmp_path):
    result = run_bench("train_throughput.py", ["--steps", "2", "--rounds", "2", "--warmup", "0", "--max-tokens", "512"],
                       tmp_path)
    lines = result.stdout.strip().splitlines()
    rounds = [re.fullmatch(r"round (\d): reference ([\d,]+), ours ([\d,]+) target tokens/s", line) for line in lines[:2]]
    assert [int(m.group(1)) for m in rounds] == [1, 2]
    reference = float(re.search(r"reference torch.nn.Transformer fp32 eager: ([\d,]+) target tokens/s \(median of 2\)",
                                result.stdout).group(1).replace(",", ""))
    ours = float(re.search(r"transformer package bf16 eager, .*: ([\d,]+) target tokens/s \(median of 2\)",
                           result.stdout).group(1).replace(",", ""))
    assert reference > 0 and ours > 0
    assert lines[-1].startswith("ratio=")
    assert float(lines[-1].split("=")[1]) == pytest.approx(ours / reference, abs=0.01)  # medians printed rounded
