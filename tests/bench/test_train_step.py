"""bench/train_step.py runs end to end on one tiny round and prints each variant's speed, the machine,
and the ratios last. Speeds are printed, never asserted."""

import re

import pytest

from tests.bench import ROOT, run_bench

pytestmark = pytest.mark.slow


def test_step_bench_times_every_variant_and_prints_the_ratios(tmp_path):
    """``--against`` this very checkout (a CI clone has no second revision; a user names a worktree);
    the levers that need no compiler (``compiled`` compiles for minutes: the GPU campaign times it)
    and no other package (the allocators: jemalloc may be missing)."""
    result = run_bench("train_step.py", ["--against", str(ROOT), "--levers", "prefetch2,processes2,pad64,rdrop5",
                                         "--preset", "small",
                                         "--max-tokens", "256", "--rounds", "1", "--windows", "1", "--log-every", "2",
                                         "--threads", "2", "--precision", "fp32"], cwd=tmp_path)
    out = result.stdout
    for name in ("ours", "theirs", "prefetch2", "processes2", "pad64", "rdrop5"):
        assert re.search(rf"^ +{name}.*: [\d,]+ target tokens/s \(median of 1 windows\)$", out, re.M), out
    assert re.search(r"^machine: .*2 threads, precision fp32, preset small \(d_model 256, 3\+3 layers\), "
                     r"256 tokens per update$", out, re.M), out
    assert re.search(r"^ours on the train stage's allocator: malloc: (tcmalloc \(/.+\)|glibc, kept from|the system)",
                     out, re.M), out
    ratios = re.findall(r"^(\w+)_ratio=(\d+\.\d{3})$", out, re.M)
    assert [name for name, _ in ratios] == ["prefetch2", "processes2", "pad64", "rdrop5", "against"]
    assert all(float(value) > 0 for _, value in ratios)
    assert out.rstrip().splitlines()[-1].startswith("against_ratio=")
