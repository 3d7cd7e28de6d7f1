"""The promotion gate: a challenger model replaces the registry's champion only when it is
significantly better, by sacrebleu's paired bootstrap test, on the gate set: a development set
(``flows.gate_set``, by default ``data.valid_set``), never a test set. Test sets are compared
the same way and reported beside the decision; they never decide (held-out data stays held out).
Each model translates with its own registered decoding settings (the beam size, alpha, stopping
rule and engine its evaluate stage used, tuned on the validation set): a version registered with
ctranslate2 decodes its ``ctranslate2`` artifact, one registered before the engine was a setting
decodes with torch, as it was scored.

No Prefect here: the flow calls these functions in a task, the tests call them directly.

The test is sacrebleu's own (``sacrebleu.significance.PairedTest``, ``test_type="bs"``, the
Moses ``bootstrap-hypothesis-difference-significance.pl`` procedure, seeded by
``SACREBLEU_SEED``, default 12345). Its p-value is two-sided (how often a resampled difference
is at least as large as the observed one, in either direction), so the direction comes from
the scores: *better* is a higher BLEU with p < significance, *worse* a lower BLEU with
p < significance. Identical outputs are neither (sacrebleu reports p = 1/(n+1) for a zero
difference; a tie is recorded as p = 1, and the direction rule keeps it from promoting anything).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipeline.tracking.store import CHAMPION_ALIAS

PROMOTED, FIRST_MODEL, REJECTED, UNCHANGED = "promoted", "first-model", "rejected", "unchanged"


NO_CHALLENGER = "no-challenger-yet"   # the new model's registration still waits for the tracking server


class GateError(RuntimeError):
    """The run cannot be judged (partial outputs, no registered model): nothing is promoted."""


def pending_challenger(root: Path, model_file: Path) -> str:
    """Why there is no challenger yet, when the registration of ``root``'s model waits in the unsent
    queue (``pipeline.tracking.unsent.deferred``: the tracking server was away); "" otherwise. The gate
    then promotes nothing and fails nothing: the version is registered when the queue is sent."""
    from pipeline.tracking.unsent.deferred import HANDLED_BY, SENT_BY, pending_registration
    from transformer.atomic import file_sha256

    model = root / model_file
    record = pending_registration(file_sha256(model), root) if model.is_file() else None
    if record is None:
        return ""
    what = f"the registration of {record['registers']!r} for {model_file} (sha256 {record['model_sha256'][:12]})"
    if record.get("set_aside_at"):
        return (f"no challenger yet: {what} is set aside in reports/mlflow_unsent.json ({record['reason']}); "
                f"{HANDLED_BY}")
    return f"no challenger yet: {what} waits for the tracking server in reports/mlflow_unsent.json; sent by {SENT_BY}"


@dataclass(frozen=True)
class Systems:
    """One evaluation set: its references and the two models' translations of its sources.
    ``tokenized``: all three in the literature's text form (``pipeline.text.forms``: the models write
    ``lc.norm.tok`` text, the references are upstream's ``lc.norm.tok`` files), scored as they are
    (``bleu_lc_tok``: whitespace tokens, no smoothing) instead of by sacreBLEU's detokenized BLEU."""

    references: Sequence[str]
    champion: Sequence[str]
    challenger: Sequence[str]
    tokenized: bool = False


def check_comparable(champion_form: str, challenger_form: str, name: str, champion_version: str) -> None:
    """``GateError`` unless the two models write the same text form: the BLEU of lowercased, tokenized
    output and that of cased text measure different things, and neither model can be judged by the
    other's. A team that switches forms on purpose moves the alias itself."""
    if champion_form != challenger_form:
        raise GateError(f"the champion ({name} version {champion_version}) writes {champion_form!r} text and the "
                        f"challenger {challenger_form!r} text (tokenizer.text_form): their BLEU cannot be compared, "
                        f"nothing is promoted; to switch forms, set the {CHAMPION_ALIAS!r} alias by hand "
                        f"(MlflowClient().set_registered_model_alias)")


@dataclass(frozen=True)
class Comparison:
    test_set: str                   # the evaluation set (the gate set or a test set)
    sentences: int
    champion_bleu: float
    challenger_bleu: float
    p_value: float

    @property
    def delta(self) -> float:
        return self.challenger_bleu - self.champion_bleu

    def better(self, significance: float) -> bool:
        return self.delta > 0 and self.p_value < significance

    def worse(self, significance: float) -> bool:
        return self.delta < 0 and self.p_value < significance


def paired_bootstrap(test_set: str, systems: Systems, resamples: int) -> Comparison:
    """Corpus BLEU of both systems and the paired bootstrap p-value of their difference."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    n = len(systems.references)
    if not n or len(systems.champion) != n or len(systems.challenger) != n:
        raise GateError(f"{test_set}: {n} references but {len(systems.champion)} champion and "
                        f"{len(systems.challenger)} challenger translations")
    # The literature's form: multi-bleu.perl on the text as it is (pipeline.scoring.literature_bleu).
    bleu = (BLEU(references=[list(systems.references)], tokenize="none", smooth_method="none", force=True)
            if systems.tokenized else BLEU(references=[list(systems.references)]))
    test = PairedTest([("champion", list(systems.champion)), ("challenger", list(systems.challenger))],
                      {"BLEU": bleu}, references=None, test_type="bs", n_samples=resamples)
    _, scores = test()
    champion, challenger = scores["BLEU"]
    # No difference, no evidence: sacrebleu's p for a zero difference is 1/(n+1), recorded as 1.
    p_value = 1.0 if challenger.score == champion.score else float(challenger.p_value)
    return Comparison(test_set, n, round(champion.score, 2), round(challenger.score, 2), p_value)


def decide(comparisons: Mapping[str, Comparison], gate_set: str, significance: float) -> tuple[bool, str]:
    """(promote?, why) from the gate set's comparison alone; the others are reported, never read here."""
    c = comparisons[gate_set]
    change = f"BLEU {c.champion_bleu:.2f} -> {c.challenger_bleu:.2f} on {gate_set}, p={c.p_value:.4f}"
    if c.better(significance):
        return True, f"significantly better: {change} < {significance}"
    if c.delta > 0:
        return False, f"not significantly better: {change} >= {significance}"
    return False, f"not better: {change}"


@dataclass
class Decision:
    verdict: str                    # promoted | first-model | rejected | unchanged
    reason: str
    model_name: str
    challenger: ModelVersion
    champion: ModelVersion | None
    significance: float
    resamples: int
    gate_set: str                   # the development set that decides
    comparisons: list[Comparison] = field(default_factory=list)   # the gate set's first, then the test sets'
    decoding: dict[str, str] = field(default_factory=dict)        # "champion"/"challenger" -> their settings

    @property
    def promoted(self) -> bool:
        return self.verdict in (PROMOTED, FIRST_MODEL)

    def tags(self) -> dict[str, str]:
        """What the challenger run records about the decision (``gate.*`` tags)."""
        tags = {
            "gate.decision": self.verdict, "gate.reason": self.reason[:4000],
            "gate.challenger_version": str(self.challenger.version),
            "gate.champion_version": str(self.champion.version) if self.champion else "none",
            "gate.significance": str(self.significance), "gate.bootstrap_resamples": str(self.resamples),
            "gate.gate_set": self.gate_set,
            "gate.reported_sets": json.dumps([c.test_set for c in self.comparisons if c.test_set != self.gate_set]),
            "gate.time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tags.update({f"gate.{who}_decoding": settings for who, settings in self.decoding.items()})
        for c in self.comparisons:
            tags.update({f"gate.{c.test_set}.champion_bleu": f"{c.champion_bleu:.2f}",
                         f"gate.{c.test_set}.challenger_bleu": f"{c.challenger_bleu:.2f}",
                         f"gate.{c.test_set}.p_value": f"{c.p_value:.4f}"})
        return tags

    def summary(self) -> dict[str, object]:
        return {"verdict": self.verdict, "promoted": self.promoted, "reason": self.reason,
                "challenger_version": str(self.challenger.version),
                "champion_version": str(self.champion.version) if self.champion else None,
                "gate_set": self.gate_set, "decoding": dict(self.decoding),
                "comparisons": [{"set": c.test_set, "decides": c.test_set == self.gate_set,
                                 "champion_bleu": c.champion_bleu, "challenger_bleu": c.challenger_bleu,
                                 "p_value": c.p_value} for c in self.comparisons]}

    def markdown(self) -> str:
        champion = f"version {self.champion.version}" if self.champion else "none"
        lines = [
            f"# Promotion gate: {self.verdict}", "",
            f"- registered model: `{self.model_name}`",
            f"- challenger: version {self.challenger.version} (MLflow run `{self.challenger.run_id}`)",
            f"- champion before: {champion}",
            f"- decision: **{self.verdict}**: {self.reason}",
            f"- test: sacrebleu paired bootstrap, {self.resamples} resamples, significance {self.significance}; "
            f"decided on the development set `{self.gate_set}`; test sets are reported, they never decide",
        ]
        lines += [f"- {who} decodes with {settings}" for who, settings in self.decoding.items()]
        if self.comparisons:
            lines += ["", "| set | role | sentences | champion BLEU | challenger BLEU | delta | p-value |",
                      "|---|---|---:|---:|---:|---:|---:|"]
            lines += [f"| {c.test_set} | {'decides' if c.test_set == self.gate_set else 'reported'} | {c.sentences} | "
                      f"{c.champion_bleu:.2f} | {c.challenger_bleu:.2f} | {c.delta:+.2f} | {c.p_value:.4f} |"
                      for c in self.comparisons]
        return "\n".join(lines) + "\n"


def current_champion(client: MlflowClient, name: str) -> ModelVersion | None:
    try:
        return client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except MlflowException:
        return None


def promote_if_better(client: MlflowClient, name: str, challenger: ModelVersion, champion: ModelVersion | None,
                      systems: Mapping[str, Systems] | None, *, gate_set: str, significance: float, resamples: int,
                      extra_tags: Mapping[str, str] | None = None,
                      decoding: Mapping[str, str] | None = None) -> Decision:
    """Judge ``challenger`` against ``champion`` on ``systems`` (per evaluation set): the decision
    is the gate set's paired bootstrap alone; the other sets (the test sets) are compared and
    reported. Record it as ``gate.*`` tags on the challenger's run (and ``gate.decision`` on its
    model version), and move the ``champion`` alias to it when it wins. With no champion the
    challenger is promoted; when it already is the champion nothing is recorded or changed."""
    decision = Decision(UNCHANGED, "", name, challenger, champion, significance, resamples, gate_set,
                        decoding=dict(decoding or {}))
    if champion is not None and str(champion.version) == str(challenger.version):
        decision.reason = f"version {challenger.version} already is the champion (no new model)"
        return decision
    if champion is None:
        decision.verdict = FIRST_MODEL
        decision.reason = f"no {CHAMPION_ALIAS} yet: the first complete model is promoted"
    else:
        if not systems or gate_set not in systems:
            raise GateError(f"the gate needs both models' translations of the gate set {gate_set}")
        order = [gate_set, *(s for s in systems if s != gate_set)]
        decision.comparisons = [paired_bootstrap(s, systems[s], resamples) for s in order]
        promote, decision.reason = decide({c.test_set: c for c in decision.comparisons}, gate_set, significance)
        decision.verdict = PROMOTED if promote else REJECTED
    from mlflow.entities import RunTag

    tags = {**decision.tags(), **(extra_tags or {})}
    client.log_batch(challenger.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_model_version_tag(name, str(challenger.version), "gate.decision", decision.verdict)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION_ALIAS, str(challenger.version))
    return decision


# ----------------------------------------------------------------------------- challenger and champion


def challenger_version(client: MlflowClient, name: str, run_id: str | Sequence[str]) -> ModelVersion:
    """The newest version of ``name`` registered from ``run_id`` or from one of its descendant runs
    (tune and evaluate log into a child run when their params differ from the run's: evaluate's
    may be a child of tune's). Several runs may have made the same model file (a training resumed
    to the same weights, whose tune and evaluate DVC restored from the run-cache and so did not
    register again): ``run_id`` may list them all, and a version of any of them is the challenger."""
    given = [run_id] if isinstance(run_id, str) else list(run_id)
    run_id = given[0]
    run = client.get_run(run_id)
    run_ids, frontier = set(given), list(given)
    while frontier:
        parent = frontier.pop()
        for child in client.search_runs([run.info.experiment_id],
                                        filter_string=f"tags.mlflow.parentRunId = '{parent}'"):
            if child.info.run_id not in run_ids:
                run_ids.add(child.info.run_id)
                frontier.append(child.info.run_id)
    versions = [v for v in client.search_model_versions(f"name = '{name}'") if v.run_id in run_ids]
    if not versions:
        raise GateError(f"no version of registered model {name!r} comes from MLflow run {run_id} "
                        "(the evaluate stage registers it): nothing to promote")
    version = max(versions, key=lambda v: int(v.version))
    if version.status != "READY":
        raise GateError(f"{name} version {version.version} is {version.status}, not READY: nothing to promote")
    status = client.get_run(version.run_id).info.status
    if status != "FINISHED":
        raise GateError(f"MLflow run {version.run_id} of {name} version {version.version} is {status}, "
                        "not FINISHED: nothing is promoted from a partial run")
    return version


def translate_with_version(client: MlflowClient, name: str, version: str, sources: Mapping[str, Sequence[str]],
                           beam_size: int | None, alpha: float | None, max_len_b: int, batch_sentences: int,
                           precision: str = "fp32", tracking_uri: str | None = None,
                           comparable_with: str | None = None) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Translate each set's sources with a registered model version (its own checkpoint and
    tokenizer, the pyfunc model's artifacts) and its engine (its ``ctranslate2`` artifact where the
    engine is ctranslate2; torch where it has none or CTranslate2 cannot load it, with a warning).
    ``beam_size`` / ``alpha`` None: the version's own registered settings (what its evaluate stage
    chose, ``pipeline.serving.registered``), as its stopping rule, engine and compute type always are
    (versions registered before there was a choice stop by the exact rule they were scored with, and
    decode with torch); ``max_len_b``, ``batch_sentences`` and ``precision`` are the caller's, as the
    challenger's. Returns the translations by set (in the model's own text form) and the tuned settings
    used (``TUNED``: the engine that decoded) with ``text_form``, the form the model writes.
    ``comparable_with``: the text form of the model it is to be compared with (``check_comparable``,
    before anything is translated)."""
    from pipeline.config.decoding import TUNED
    from pipeline.serving.engine import load_engine_translator
    from pipeline.serving.registered import SettingsNotRecorded, mlmodel_settings
    from pipeline.text.names import text_form_of
    from transformer.checkpoint import load_checkpoint

    with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
        files = version_files(client, name, version, Path(tmp), tracking_uri)
        try:
            own = mlmodel_settings(files["MLmodel"])
        except SettingsNotRecorded as err:
            raise GateError(f"{name} version {version} {err}") from None
        checkpoint = load_checkpoint(files["model"])   # loaded once: its form, then its translator
        form = text_form_of(checkpoint, f"{name} version {version}")
        if comparable_with is not None:
            check_comparable(form.name, comparable_with, name, version)
        decoding = own.replace(beam_size=beam_size, alpha=alpha, max_len_b=max_len_b,
                               batch_sentences=batch_sentences, precision=precision)
        translator = load_engine_translator(checkpoint, files["tokenizer"], decoding,
                                            ct2_model=files.get("ctranslate2"),
                                            model_source=f"{name} version {version}")
        used = {key: getattr(translator.decoding, key) for key in TUNED}
        if used["engine"] == "torch":
            used["compute_type"] = None   # CTranslate2's only, as in reports/metrics.json
        used["text_form"] = form.name
        return {name_: translator.translate(list(lines)) for name_, lines in sources.items()}, used


def version_files(client: MlflowClient, name: str, version: str, dst: Path,
                  tracking_uri: str | None = None) -> dict[str, Path]:
    """Download a registered version's pyfunc model into ``dst``; returns its artifacts by key:
    ``model`` (the averaged checkpoint: config + weights), ``tokenizer`` (the SentencePiece model)
    and, where it has one, ``ctranslate2`` (the CTranslate2 model's folder), as
    ``pipeline.pyfunc.log_version.log_translator`` logged them, and ``MLmodel`` (its metadata)."""
    import mlflow

    uri = client.get_model_version_download_uri(name, version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst), tracking_uri=tracking_uri))
    flavor = yaml.safe_load((local / "MLmodel").read_text())["flavors"]["python_function"]
    files = {key: local / value["path"] for key, value in flavor.get("artifacts", {}).items()}
    missing = [key for key in ("model", "tokenizer") if key not in files or not files[key].is_file()]
    if missing:
        raise GateError(f"{name} version {version} has no {' or '.join(missing)} artifact: "
                        "not a model logged by the evaluate stage")
    return {**files, "MLmodel": local / "MLmodel"}
