"""pipeline/compare.py: runs ranked by BLEU, naming the params that differ between them."""

import subprocess
import sys


def test_compare_ranks_two_runs_and_names_the_differing_param(workspace, beam1_experiment):
    result = workspace.run(sys.executable, "-m", "pipeline.compare")
    assert result.returncode == 0, result.stderr
    assert "Params that differ between runs: evaluate.beam_size" in result.stdout
    report = (workspace.path / "reports/compare.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2  # header, rule, two runs
    bleus = [float(line.split("|")[4]) for line in table[2:]]
    assert bleus == sorted(bleus, reverse=True)
    assert {line.split("|")[-2].strip() for line in table[2:]} == {"1", "2"}  # the beam sizes
    assert (workspace.path / "reports/compare_valid.png").is_file()
