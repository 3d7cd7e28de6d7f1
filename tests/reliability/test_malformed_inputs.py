"""Malformed inputs, one table: params, corpora, checkpoints, archives and downloads.

Each case copies a small finished workspace (``base_workspace``: corpus, tokenizer, token
stores, checkpoints, averaged model), breaks one input, and runs the real entry point: a
stage's ``main`` under ``run_stage``, as ``python -m pipeline.stages.<stage>`` does (in this
process, so that a fake data set's published hashes can be registered), or for one archive
case the library's ``extract_tar``. Each case asserts:

- exit code 2 and exactly one line on stderr, ``error: ...``, holding the expected fragment
  (the key, file or problem); a traceback would fail the case;
- nothing written: every file of the workspace (data/, models/, reports/, mlflow.db ...) and
  the checksums record are byte-identical afterwards. The one exception is the download cache
  (``data/cache``, not a DVC output): it may gain verified downloads, byte-identical copies of
  mirror files (or members of mirror archives), never an unverified or partial one.
"""

from __future__ import annotations

import builtins
import gzip
import hashlib
import importlib
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.data import checksums, registry
from pipeline.data.fetch import extract_tar
from pipeline.data.spec import DataError
from pipeline.stages.runner import run_stage
from transformer.checkpoint import load_checkpoint, model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import train_tokenizer

from ..fakes import (
    RAW,
    corrupt,
    device,
    fake_multi30k,
    fake_statmt,
    link,
    published_spec,
    sentences,
    snapshot,
    tar,
    write_gz,
)

pytestmark = pytest.mark.fast

CKPT_2 = "models/checkpoints/checkpoint_00000002.pt"
CKPT_4 = "models/checkpoints/checkpoint_00000004.pt"
MODEL = "models/model.pt"
WMT = {"dataset": "wmt14_en_de", "src_lang": "en", "tgt_lang": "de", "valid_set": "newstest2013",
       "test_sets": ["newstest2014"], "incoming_dir": ""}
EUROPARL = "wmt13/training-parallel-europarl-v7.tgz"
EN, DE = "training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de"


@dataclass
class Ctx:
    ws: Path                 # the workspace the stage runs in (its cwd)
    outside: Path            # beside it: mirrors, the checksums record
    monkeypatch: pytest.MonkeyPatch
    mirror: Path | None = None

    def params(self, edit: Callable[[dict], None]) -> None:
        path = self.ws / "params.yaml"
        params = yaml.safe_load(path.read_text())
        edit(params)
        path.write_text(yaml.safe_dump(params, sort_keys=False))


@dataclass(frozen=True)
class Case:
    id: str
    entry: str | Callable[[Ctx], None]   # a stage name, or a library call that must raise DataError
    message: str                         # a fragment of the one-line error
    setup: Callable[[Ctx], None] = field(default=lambda ctx: None)


# ----------------------------------------------------------------------------- setups


def set_(section: str, **values) -> Callable[[Ctx], None]:
    return lambda ctx: ctx.params(lambda p: p.setdefault(section, {}).update(values))


def write(rel: str, content: bytes | str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return setup


def remove(rel: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = ctx.ws / rel
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return setup


def truncate(rel: str) -> Callable[[Ctx], None]:
    return lambda ctx: corrupt(ctx.ws / rel, "truncated")


def both(*setups: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for s in setups:
            s(ctx)
    return setup


def multi30k(before: Callable[[Path], None] | None = None, after: Callable[[Path], None] | None = None,
             ) -> Callable[[Ctx], None]:
    """A Multi30k-shaped mirror whose files' hashes are registered as published: ``before``
    changes it before the hashes are taken (content problems), ``after`` after (hash mismatches)."""
    def setup(ctx: Ctx) -> None:
        ctx.mirror = fake_multi30k(ctx.outside / "mirror")
        if before:
            before(ctx.mirror)
        ctx.monkeypatch.setitem(registry.REGISTRY, "multi30k", published_spec(ctx.mirror))
        if after:
            after(ctx.mirror)
        ctx.monkeypatch.setenv("DATA_MIRROR", str(ctx.mirror))
    return setup


def statmt(replace: dict | None = None, after: Callable[[Path], None] | None = None) -> Callable[[Ctx], None]:
    """WMT14 en-de from a statmt.org-shaped folder; ``replace`` swaps an archive's entries."""
    def setup(ctx: Ctx) -> None:
        ctx.params(lambda p: p["data"].update(WMT))
        ctx.mirror = fake_statmt(ctx.outside / "statmt", registry.REGISTRY["wmt14_en_de"], replace)
        if after:
            after(ctx.mirror)
        ctx.monkeypatch.setenv("DATA_MIRROR", str(ctx.mirror))
    return setup


def europarl(*entries) -> dict:
    """The Europarl archive (the first file the WMT14 en-de download fetches) with other entries."""
    return {EUROPARL: list(entries)}


def gz_lines(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / RAW / name).write_bytes(gzip.compress(data, mtime=0))


def lines(*rows: str) -> bytes:
    return "".join(f"{r}\n" for r in rows).encode()


def other_model(vocab_size: int = 80, **overrides) -> Transformer:
    torch.manual_seed(5)
    return Transformer(build_config("tiny", vocab_size, **overrides))


def other_config_checkpoint(rel: str) -> Callable[[Ctx], None]:
    """A training checkpoint of the same shape as the others but trained with d_ff 48."""
    def setup(ctx: Ctx) -> None:
        state = load_checkpoint(ctx.ws / rel)
        other = model_checkpoint(other_model(d_ff=48))
        state.update(model_config=other["model_config"], model=other["model"])
        save_checkpoint(ctx.ws / rel, state)
    return setup


def config_not_matching_weights(ctx: Ctx) -> None:
    state = load_checkpoint(ctx.ws / MODEL)
    state["model_config"]["d_ff"] = 48
    save_checkpoint(ctx.ws / MODEL, state)


class CodeRunner:
    """Unpickling it calls open(<outside>/PWNED, "w"): a file that runs code when loaded unsafely."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return builtins.open, (str(self.target), "w")


def code_running_pickle(rel: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        target = ctx.outside / "PWNED"
        torch.save({"model": CodeRunner(target)}, ctx.ws / rel)
        torch.load(ctx.ws / rel, weights_only=False)  # the proof: an unsafe load runs it ...
        assert target.exists()
        target.unlink()                                 # ... the case asserts ours does not
    return setup


def other_tokenizer(ctx: Ctx) -> None:
    text = (ctx.ws / "data/corpus/train.en").read_text().splitlines()
    train_tokenizer(text, ctx.ws / "data/tokenizer/spm.model", 60)


def init_from_other_config(ctx: Ctx) -> None:
    save_checkpoint(ctx.ws / "models/other.pt", model_checkpoint(other_model(d_ff=48)))
    ctx.params(lambda p: (p["train"].update(init_from="models/other.pt"),
                          p["tokenizer"].update(model_from="data/tokenizer/spm.model")))
    shutil.rmtree(ctx.ws / "models/checkpoints")


def wrong_recorded_hash(ctx: Ctx) -> None:
    url = registry.REGISTRY["wmt14_en_de"].base_url + EUROPARL
    checksums.record_checksum(url, "0" * 64)


def traversal_archive(ctx: Ctx) -> None:
    tar(ctx.outside / "evil.tgz", [("good.txt", b"fine\n"), ("../../evil.txt", b"escaped\n")])


def extract_everything(ctx: Ctx) -> None:
    """The library's extraction of a whole archive (the stage extracts only registered members)."""
    extract_tar(ctx.outside / "evil.tgz", ctx.ws / "data" / "cache" / "x" / "dest")


def incoming(files: dict[str, bytes]) -> Callable[[Ctx], None]:
    return both(multi30k(), *(write(f"data/incoming/{name}", data) for name, data in files.items()))


INVALID_UTF8 = lines("zwei hunde", "ein mann").replace(b"zwei", b"zw\xffei")
TRUNCATED_GZ = gzip.compress(lines(*sentences("val", "en", 500)), mtime=0)[:-40]

CASES = [
    # ------------------------------------------------------------------ params
    Case("params/unknown-key", "train", "params.yaml: unknown key train.warmup_stepz", set_("train", warmup_stepz=10)),
    Case("params/bad-value", "train", "params.yaml: train.max_tokens must be a positive integer, got -5",
         set_("train", max_tokens=-5)),
    Case("params/wrong-type", "tokenizer", "params.yaml: tokenizer.vocab_size must be an integer, got 'big'",
         set_("tokenizer", vocab_size="big")),
    Case("params/unknown-preset", "train", "model.preset 'huge' does not exist", set_("model", preset="huge")),
    Case("params/heads-do-not-divide", "train", "model.d_model (32) must be divisible by model.n_heads (5)",
         set_("model", n_heads=5)),
    Case("params/fp16-on-cpu", "train", "train.precision fp16 needs a GPU", set_("train", precision="fp16")),
    Case("params/cuda-without-gpu", "train", "train.device is cuda but no GPU is visible",
         set_("train", device="cuda")),
    Case("params/no-training-limit", "train", "train.max_steps, train.max_epochs and train.max_minutes are all 0",
         set_("train", max_steps=0, max_epochs=0, max_minutes=0)),
    Case("params/vocab-too-large", "tokenizer", "tokenizer.vocab_size 5000 is larger than this corpus supports",
         set_("tokenizer", vocab_size=5000)),
    Case("params/unknown-dataset", "download", "data.dataset 'nope' is not in the registry",
         set_("data", dataset="nope")),
    Case("params/unknown-test-set", "evaluate", "data.test_sets: 'test_2099' is not a split of multi30k",
         set_("data", test_sets=["test_2099"])),
    Case("params/beam-zero", "evaluate", "evaluate.beam_size must be a positive integer, got 0",
         set_("evaluate", beam_size=0)),
    Case("params/last-n-zero", "average", "average.last_n must be positive, got 0", set_("average", last_n=0)),
    Case("params/unknown-section", "average", "params.yaml: unknown section trian",
         lambda ctx: ctx.params(lambda p: p.update(trian={}))),
    Case("params/section-not-a-mapping", "train", "params.yaml: section train must be a mapping, got 5",
         lambda ctx: ctx.params(lambda p: p.update(train=5))),
    Case("params/not-yaml", "download", "params.yaml is not valid YAML", write("params.yaml", "train: [unclosed\n")),
    Case("params/missing-file", "evaluate", "params file params.yaml does not exist", remove("params.yaml")),
    # ------------------------------------------------------------------ corpora
    Case("corpus/misaligned", "download",
         f"misaligned corpus: {RAW}/train.en.gz has 20 lines but {RAW}/train.de.gz has 19",
         multi30k(before=lambda r: write_gz(r / RAW / "train.de.gz", sentences("train", "de", 19)))),
    Case("corpus/invalid-utf8", "download", f"{RAW}/val.de.gz: line 1 is not valid UTF-8",
         multi30k(before=gz_lines("val.de.gz", INVALID_UTF8 + lines(*sentences("val", "de", 3))))),
    Case("corpus/empty", "download", "train: no sentence pairs left after cleaning (0 raw pairs)",
         multi30k(before=lambda r: (gz_lines("train.en.gz", b"")(r), gz_lines("train.de.gz", b"")(r)))),
    Case("corpus/empty-line-in-test-set", "download",
         f"test_2016_flickr: {RAW}/test_2016_flickr.en.gz sentence 2 is empty",
         multi30k(before=gz_lines("test_2016_flickr.en.gz", lines("one", "  ", "three", "four", "five")))),
    Case("corpus/missing-test-set", "download", f"has no {RAW}/test_2016_flickr.de.gz",
         multi30k(before=lambda r: (r / RAW / "test_2016_flickr.de.gz").unlink())),
    Case("corpus/truncated-gzip", "download", f"{RAW}/val.en.gz: cannot read after line",
         multi30k(before=lambda r: (r / RAW / "val.en.gz").write_bytes(TRUNCATED_GZ))),
    Case("corpus/mirror-not-a-folder", "download", "(DATA_MIRROR or data.mirror) is not a directory",
         lambda ctx: ctx.monkeypatch.setenv("DATA_MIRROR", str(ctx.outside / "nowhere"))),
    Case("corpus/mirror-bad-scheme", "download", "unsupported scheme 'ftp'",
         lambda ctx: ctx.monkeypatch.setenv("DATA_MIRROR", "ftp://127.0.0.1/multi30k")),
    Case("corpus/incoming-one-side", "download",
         "data/incoming/news.de is missing: incoming data comes in pairs <name>.en and <name>.de",
         incoming({"news.en": lines("a new sentence")})),
    Case("corpus/incoming-misaligned", "download",
         "misaligned corpus: data/incoming/news.en has 2 lines but data/incoming/news.de has 1",
         incoming({"news.en": lines("one", "two"), "news.de": lines("eins")})),
    Case("corpus/incoming-invalid-utf8", "download", "data/incoming/news.de: line 1 is not valid UTF-8",
         incoming({"news.en": lines("two dogs", "a man"), "news.de": INVALID_UTF8})),
    Case("corpus/incoming-dvc-data-missing", "download",
         "data/incoming/more.en is versioned by DVC (more.en.dvc) but missing: run dvc pull",
         incoming({"more.en.dvc": b"outs: []\n"})),
    Case("corpus/tokenizer-without-corpus", "tokenizer", "data/corpus/train.en does not exist",
         remove("data/corpus")),
    Case("corpus/tokenizer-invalid-utf8", "tokenizer", "data/corpus/train.de: line 1 is not valid UTF-8",
         write("data/corpus/train.de", INVALID_UTF8)),
    Case("corpus/tokenizer-misaligned", "tokenizer",
         "misaligned corpus: data/corpus/val.en has 12 lines but data/corpus/val.de has 11",
         lambda ctx: (ctx.ws / "data/corpus/val.de").write_text(
             "".join(f"{s}\n" for s in (ctx.ws / "data/corpus/val.de").read_text().splitlines()[:11]))),
    Case("corpus/train-without-token-store", "train",
         "data/tokens/train is not a token store (no meta.json): run the tokenizer stage first",
         remove("data/tokens")),
    Case("corpus/train-token-store-truncated", "train", "token store data/tokens/val cannot be read",
         truncate("data/tokens/val/tgt.tokens.npy")),
    Case("corpus/evaluate-reference-missing", "evaluate",
         "test set test_2016_flickr: data/corpus/test_2016_flickr.de does not exist",
         remove("data/corpus/test_2016_flickr.de")),
    # ------------------------------------------------------------------ checkpoints
    Case("checkpoint/truncated", "average", f"checkpoint {CKPT_4} cannot be loaded safely", truncate(CKPT_4)),
    Case("checkpoint/empty-file", "average", f"checkpoint {CKPT_4} cannot be loaded safely", write(CKPT_4, b"")),
    Case("checkpoint/not-a-checkpoint", "average", "not the zip archive torch.save writes: is it a checkpoint?",
         write(CKPT_4, "step: 4\n")),
    Case("checkpoint/pickle-runs-code", "average", "Weights only load failed", code_running_pickle(CKPT_4)),
    Case("checkpoint/no-model-entries", "average", f"{CKPT_4} has no model_config/model entries",
         lambda ctx: torch.save({"step": 4}, ctx.ws / CKPT_4)),
    Case("checkpoint/other-model-config", "average", f"{CKPT_4} has a different model config from {CKPT_2}: d_ff",
         other_config_checkpoint(CKPT_4)),
    Case("checkpoint/train-resume-truncated", "train", f"checkpoint {CKPT_4} cannot be loaded safely",
         truncate(CKPT_4)),
    Case("checkpoint/init-from-other-config", "train",
         "train.init_from: models/other.pt was trained with another model config: d_ff 48 (this model: 64)",
         init_from_other_config),
    Case("checkpoint/model-missing", "evaluate", f"{MODEL} does not exist: run the earlier stages first",
         remove(MODEL)),
    Case("checkpoint/model-truncated", "evaluate", f"checkpoint {MODEL} cannot be loaded safely", truncate(MODEL)),
    Case("checkpoint/model-pickle-runs-code", "evaluate", "Weights only load failed", code_running_pickle(MODEL)),
    Case("checkpoint/weights-do-not-fit-config", "evaluate",
         f"{MODEL} does not fit this model: encoder_layers.0.ffn.linear1.weight has shape (64, 32), "
         "the model expects (48, 32)", config_not_matching_weights),
    Case("checkpoint/model-and-tokenizer-vocabularies-differ", "evaluate",
         f"{MODEL} has a vocabulary of 80 but data/tokenizer/spm.model has 60 pieces", other_tokenizer),
    Case("checkpoint/tokenizer-not-sentencepiece", "evaluate", "data/tokenizer/spm.model",
         write("data/tokenizer/spm.model", b"not a sentencepiece model")),
    # ------------------------------------------------------------------ archives and downloads
    Case("archive/path-traversal-member", extract_everything, "evil.tgz: unsafe member rejected", traversal_archive),
    Case("archive/symlink-absolute", "download", "training-parallel-europarl-v7.tgz: unsafe member rejected",
         statmt(europarl(link(EN, "/etc/passwd"), (DE, b"x\n")))),
    Case("archive/symlink-escaping", "download", "training-parallel-europarl-v7.tgz: unsafe member rejected",
         statmt(europarl(link(EN, "../../../../../../../../etc/passwd"), (DE, b"x\n")))),
    Case("archive/hardlink-outside", "download", "training-parallel-europarl-v7.tgz: unsafe member rejected",
         statmt(europarl(link(EN, "/etc/passwd", tarfile.LNKTYPE), (DE, b"x\n")))),
    Case("archive/device-file", "download", "training-parallel-europarl-v7.tgz: unsafe member rejected",
         statmt(europarl(device(EN), (DE, b"x\n")))),
    Case("archive/missing-member", "download", f"training-parallel-europarl-v7.tgz has no member {DE}",
         statmt(europarl((EN, b"x\n")))),
    Case("archive/truncated-tgz", "download", "training-parallel-europarl-v7.tgz: cannot extract",
         statmt(after=lambda r: corrupt(r / EUROPARL, "truncated"))),
    Case("archive/not-an-archive", "download", "training-parallel-europarl-v7.tgz: cannot extract",
         statmt(after=lambda r: (r / EUROPARL).write_bytes(b"<html>502 Bad Gateway</html>\n"))),
    Case("archive/wrong-recorded-checksum", "download",
         f"sha256 mismatch for {{mirror}}/{EUROPARL}: expected {'0' * 64}", both(statmt(), wrong_recorded_hash)),
    Case("download/tampered", "download", f"sha256 mismatch for {{mirror}}/{RAW}/train.en.gz",
         multi30k(after=lambda r: corrupt(r / RAW / "train.en.gz", "tampered"))),
    Case("download/truncated", "download", f"sha256 mismatch for {{mirror}}/{RAW}/train.en.gz",
         multi30k(after=lambda r: corrupt(r / RAW / "train.en.gz", "truncated"))),
]


# ----------------------------------------------------------------------------- the test


def verified_download(rel: str, digest: str, mirror: Path | None) -> bool:
    """Whether ``rel`` (new in the workspace) is a download-cache copy of a mirror file, or an
    extracted member of a mirror archive, with the same bytes."""
    parts = Path(rel).parts
    if mirror is None or parts[:2] != ("data", "cache") or len(parts) < 4:
        return False
    inner = Path(*parts[3:]).as_posix()          # below data/cache/<data set's cache folder>/
    if not inner.startswith("extracted/"):
        source = mirror / inner
        return source.is_file() and hashlib.sha256(source.read_bytes()).hexdigest() == digest
    for archive in mirror.rglob("*.t*"):
        prefix = f"extracted/{archive.relative_to(mirror).as_posix()}."
        if inner.startswith(prefix):
            member = inner[len(prefix):].split("/", 1)[1]
            with tarfile.open(archive) as t:
                data = t.extractfile(member).read()
            return hashlib.sha256(data).hexdigest() == digest
    return False


def run_entry(case: Case, ctx: Ctx, capsys: pytest.CaptureFixture) -> str:
    """Run the case's entry point; returns its one error line."""
    capsys.readouterr()
    if isinstance(case.entry, str):
        module = importlib.import_module(f"pipeline.stages.{case.entry}")
        ctx.monkeypatch.setattr(sys, "argv", [f"pipeline/stages/{case.entry}.py"])
        with pytest.raises(SystemExit) as stopped:
            run_stage(module.main)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.endswith("\n") and err.count("\n") == 1, f"not one line on stderr:\n{err}"
        assert err.startswith("error: "), err
        return err.strip()
    with pytest.raises(DataError) as raised:
        case.entry(ctx)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_table_has_enough_cases_of_every_kind():
    kinds = [c.id.split("/")[0] for c in CASES]
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)
    assert {k: kinds.count(k) for k in dict.fromkeys(kinds)} == {
        "params": 17, "corpus": 18, "checkpoint": 14, "archive": 9, "download": 2}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_input_is_refused_in_one_line_and_nothing_is_written(case, base_workspace, tmp_path,
                                                                        monkeypatch, capsys):
    if case.id == "params/cuda-without-gpu" and torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    shutil.copytree(base_workspace, ws, ignore=shutil.ignore_patterns("mlartifacts"))
    outside.mkdir()
    monkeypatch.delenv("DATA_MIRROR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{ws / 'mlflow.db'}")
    monkeypatch.setattr(checksums, "CHECKSUMS_FILE", outside / "checksums.json")
    monkeypatch.chdir(ws)
    ctx = Ctx(ws, outside, monkeypatch)
    case.setup(ctx)
    before, before_outside = snapshot(ws), snapshot(outside)

    message = run_entry(case, ctx, capsys)

    expected = case.message.replace("{mirror}", str(ctx.mirror))
    assert expected in message, f"expected {expected!r} in {message!r}"
    after = snapshot(ws)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    unexpected = [p for p in changed if p in before or not verified_download(p, after[p], ctx.mirror)]
    assert unexpected == [], f"written: {unexpected}"
    assert snapshot(outside) == before_outside          # no checksum recorded, no code run
