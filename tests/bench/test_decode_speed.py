"""bench/decode_speed.py runs end to end (random model, synthetic sources: no data needed), says
so, and prints its work count and ratios, ``ratio=`` last. Speeds are printed, never asserted."""

import re

import pytest

from tests.bench import run_bench

pytestmark = pytest.mark.slow


def test_decode_bench_runs_and_says_what_it_measured(tmp_path):
    result = run_bench("decode_speed.py", ["--model", str(tmp_path / "none.pt"), "--train-seconds", "0",
                                           "--sentences", "6", "--batch-sentences", "3", "--max-len-b", "6",
                                           "--rounds", "1"],
                       tmp_path, DATA_MIRROR=str(tmp_path / "no-mirror"))
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("model: RANDOM") and lines[1].startswith("sources: SYNTHETIC")
    # Both naive decoders run the same search, plain or packed: the same outputs. EOS is
    # disabled, so every output has 14 + 6 pieces, and re-running the prefix costs several
    # times the cached work.
    assert re.search(r"naive \(no cache\).*same outputs as ours: 100\.0%.*reference of ratio=", result.stdout)
    assert re.search(r"naive, packed weights.*same outputs as ours: 100\.0%", result.stdout)
    assert "mean output 20.0 pieces" in result.stdout
    saved = float(re.search(r"the cache saves ([\d.]+)x", result.stdout).group(1))
    assert 3.0 < saved < 20.0
    # ratio= is the product of the two printed factors (cache, packing), up to their rounding.
    cache, packing = map(float, re.search(r"ours / naive packed ([\d.]+) .* naive packed / naive ([\d.]+)",
                                          result.stdout).groups())
    assert float(lines[-1].split("=")[1]) == pytest.approx(cache * packing, rel=0.01)
    assert lines[-2].startswith("ours_vs_ctranslate2=") and float(lines[-2].split("=")[1]) > 0
    assert lines[-1].startswith("ratio=") and float(lines[-1].split("=")[1]) > 0
