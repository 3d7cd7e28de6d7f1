"""Build the folder the GPU campaign carries to the GPU machine (``.gpu/``, git-ignored), here on the CPU.

The GPU machine has torch, sentencepiece, sacrebleu, pandas, numpy and pytest, but no package
registry, no internet and no DVC or MLflow, and a call takes at most 64 MiB of files with it. So:

- ``multi30k/data``: what the stages after the tokenizer read for ``params.yaml`` as it is (the
  default run): the token stores of every split, the SentencePiece model, the validation and test
  text (references for sacreBLEU) and upstream's tokenized references (the literature's BLEU), made
  by the pipeline's own download, references and tokenizer stages;
- ``wmt14/train``: a WMT14-shaped token store for the throughput benchmark (the synthetic WMT14
  mirror of ``tests/wmt14_fixture.py`` through the same stages with ``params/wmt14_en_de_base.yaml``:
  a 37000-piece BPE vocabulary, ~27 pieces a sentence), about 20 MB, which the benchmark cycles;
- ``wheels/``: the packages the stages import that the GPU machine lacks (cronsim for the params
  check, sacremoses for the paper's tokenized BLEU, pydantic and its needs for params.yaml's typed
  config), pinned as in requirements.txt, for its Python (3.12);
- ``baseline/``: the ``transformer`` package of ``BASELINE`` (``dc0e5c2``), the trainer whose step
  #56 measures ours against (``bench/train_step.py --against``), with its ``commit.txt``;
- ``commit.txt``: the commit the folder was made for (the GPU machine gets no ``.git``).

    python -m bench.gpu.prepare [--out .gpu] [--wmt-pairs 170000] [--multi30k-pairs 0]

Reads the Multi30k mirror from ``DATA_MIRROR`` (default ``../shared/data/multi30k``). Takes a few
minutes (the BPE vocabulary of 37000 pieces). The folder is replaced atomically.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.wmt14_fixture import generate

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MIRROR = REPO.parent / "shared" / "data" / "multi30k"
CARRY_LIMIT = 60 * 2**20   # the device tool carries 64 MiB with the working tree
# pydantic (params.yaml's typed config) with its own needs, typing_extensions at the version pydantic needs
WHEELS = ("cronsim", "sacremoses", "pydantic", "pydantic_core", "annotated-types", "typing-inspection",
          "typing_extensions")
BASELINE = "dc0e5c2"   # the trainer before the step without read-backs (#56)
WHEEL_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:", "--no-deps"]


def run_stages(workspace: Path, params: dict[str, Any], stages: list[str], env: dict[str, str]) -> None:
    """The pipeline's ``stages`` in ``workspace`` with ``params`` as its params.yaml (no DVC)."""
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for stage in stages:
        print(f"  {stage} ...", flush=True)
        result = subprocess.run([sys.executable, "-m", f"pipeline.stages.{stage}"], cwd=workspace, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: the {stage} stage failed in {workspace}:\n{result.stderr[-3000:]}")


def stage_env(work: Path, mirror: str) -> dict[str, str]:
    # The checksums of a new mirror go to a scratch file, not the repository's record.
    return {**os.environ, "PYTHONPATH": str(REPO), "DATA_MIRROR": mirror, "PIPELINE_TRACKING": "off",
            "DATA_CHECKSUMS": str(work / "checksums.json")}


def multi30k(out: Path, work: Path, mirror: Path, limit_pairs: int) -> None:
    """The default run's data after the tokenizer stage, as the later stages read it."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(incoming_dir="", limit_train_pairs=limit_pairs)   # no pairs come in there
    workspace = work / "multi30k"
    run_stages(workspace, params, ["download", "references", "tokenizer"], stage_env(work, str(mirror)))
    data = out / "multi30k" / "data"
    # references: upstream's lc.norm.tok files, for evaluate's literature measure (bleu_lc_tok)
    for folder in ("tokens", "tokenizer", "references"):
        shutil.copytree(workspace / "data" / folder, data / folder)
    (data / "corpus").mkdir(parents=True)
    d = params["data"]
    for split in [d["valid_set"], *d["test_sets"]]:
        for lang in (d["src_lang"], d["tgt_lang"]):
            shutil.copy(workspace / "data" / "corpus" / f"{split}.{lang}", data / "corpus")


def wmt14_shaped(out: Path, work: Path, pairs: int) -> None:
    """The train token store of ``pairs`` synthetic WMT14 pairs, tokenized as the base recipe does."""
    mirror = work / "statmt"
    generate(mirror, pairs, dev=200, test=200)
    params = yaml.safe_load((REPO / "params" / "wmt14_en_de_base.yaml").read_text())
    params["data"].update(incoming_dir="", mirror="")
    workspace = work / "wmt14"
    run_stages(workspace, params, ["download", "tokenizer"], stage_env(work, str(mirror)))
    shutil.copytree(workspace / "data" / "tokens" / "train", out / "wmt14" / "train")


def pinned(name: str) -> str:
    """``name==version`` as requirements.txt pins it."""
    text = (REPO / "requirements.txt").read_text()
    found = re.search(rf"^{re.escape(name)}==(\S+)$", text, re.MULTILINE | re.IGNORECASE)
    if not found:
        raise SystemExit(f"error: requirements.txt pins no {name}")
    return f"{name}=={found.group(1)}"


def wheels(out: Path) -> None:
    """Wheels of ``WHEELS`` for the GPU machine's Python (3.12, x86-64 Linux), from the package index."""
    target = out / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "-q", *WHEEL_PLATFORM, "-d", str(target),
           *(pinned(name) for name in WHEELS)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: pip download failed: {result.stderr[-2000:]}")


def baseline(out: Path) -> None:
    """``BASELINE``'s ``transformer`` package (from git: no worktree needed) into ``out/baseline``."""
    target = out / "baseline"
    target.mkdir()
    archive = subprocess.run(["git", "archive", BASELINE, "transformer"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"error: git archive {BASELINE} failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    (target / "commit.txt").write_text(BASELINE + "\n")


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def data_mirror() -> Path:
    """The Multi30k mirror, absolute: the stages run in a scratch folder, where a relative
    ``DATA_MIRROR`` (as the README writes it) would name nothing."""
    return Path(os.environ.get("DATA_MIRROR") or DEFAULT_MIRROR).resolve()


def size_of(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / ".gpu")
    parser.add_argument("--wmt-pairs", type=int, default=170_000,
                        help="synthetic WMT14 pairs of the throughput store (170k: about 20 MB)")
    parser.add_argument("--multi30k-pairs", type=int, default=0,
                        help="Multi30k training pairs (0 = all, as the default run)")
    args = parser.parse_args()
    mirror = data_mirror()
    if not (mirror / "data/task1/raw/train.en.gz").is_file():
        parser.exit(2, f"error: no Multi30k mirror at {mirror} (set DATA_MIRROR)\n")
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gpu-prepare.", dir=out.parent) as tmp:
        staged, work = Path(tmp) / "carry", Path(tmp) / "work"
        staged.mkdir()
        print("Multi30k: download and tokenizer of params.yaml", flush=True)
        multi30k(staged, work, mirror, args.multi30k_pairs)
        print(f"WMT14-shaped: {args.wmt_pairs:,} synthetic pairs through download and tokenizer "
              "(params/wmt14_en_de_base.yaml)", flush=True)
        wmt14_shaped(staged, work, args.wmt_pairs)
        print(f"wheels: {', '.join(pinned(n) for n in WHEELS)}", flush=True)
        wheels(staged)
        print(f"baseline: the transformer package of {BASELINE}", flush=True)
        baseline(staged)
        (staged / "commit.txt").write_text(commit() + "\n")
        size = size_of(staged)
        if size > CARRY_LIMIT:
            parser.exit(2, f"error: {size / 2**20:.1f} MiB to carry, over {CARRY_LIMIT / 2**20:.0f} MiB: "
                           "lower --wmt-pairs\n")
        old = out.with_name(out.name + ".old")
        if out.exists():
            out.rename(old)
        staged.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    for part in sorted(out.iterdir()):
        bytes_ = size_of(part) if part.is_dir() else part.stat().st_size
        print(f"{part.relative_to(out.parent)}: {bytes_ / 2**20:.1f} MiB")
    print(f"written: {out} ({size / 2**20:.1f} MiB, commit {commit()})")


if __name__ == "__main__":
    main()
