"""Compare the runs of the experiment, ranked by validation score, with the params that differ between them.

    python -m pipeline.experiments.compare [--experiment NAME] [--metric valid_bleu]

Ranks by ``valid_bleu``: the validation BLEU of the averaged model with the decoding settings chosen
on the validation set (the tune stage). Development data decides, test data reports: the test sets'
BLEU and chrF are columns of the table, never the ranking; runs without the ranking metric come last.
Where runs logged the literature's BLEU (``bleu_lc_tok``, Multi30k: lowercased, Moses-tokenized, against
upstream's tokenized references), its validation and test figures are columns too, never ranking; but
where the runs trained on different text forms (``tokenizer.text_form``), ``valid_bleu`` is sacreBLEU for
some and ``bleu_lc_tok`` for others, and the validation ``bleu_lc_tok`` ranks them all in one measure.
Prints a markdown table, writes it to ``reports/compare.md`` and draws the runs' validation
perplexity curves into ``reports/compare_valid.png``. Built on ``mlflow.search_runs`` and pandas.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.config.params import load_params  # noqa: E402
from pipeline.scoring.reports import LITERATURE_KEY, RANK_METRIC  # noqa: E402
from pipeline.text.names import RAW  # noqa: E402
from pipeline.tracking import store  # noqa: E402
from transformer.atomic import atomic_write, write_text  # noqa: E402

REPORT = Path("reports/compare.md")
PLOT = Path("reports/compare_valid.png")
TEXT_FORM_PARAM = "tokenizer.text_form"
# Params that differ between every pair of runs and say nothing about the model.
IGNORED_PARAMS = {"derived.train_target_tokens"}


def runs_table(experiment: str, metric: str = RANK_METRIC, test_sets: list[str] | None = None,
               sweep: str | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per run (of ``sweep`` only, when given: its tag), best validation ``metric`` first
    (runs without it last); the test sets' BLEU and chrF are shown (``test_sets`` first, then any
    other the runs have), never used to rank, and a sweep's point and the decoding each run chose on
    val. Returns the table and the names of the params that differ between runs."""
    check_metric(metric)
    store.client()
    runs = sweep_runs(experiment, sweep)
    if runs.empty:
        return runs, []
    param_cols = [c for c in runs.columns if c.startswith("params.") and c[7:] not in IGNORED_PARAMS]
    differing = [c for c in param_cols if runs[c].fillna("∅").nunique() > 1]
    metric = common_measure(runs, metric)
    metric_col = f"metrics.{metric}"
    if metric_col not in runs.columns:
        runs[metric_col] = float("nan")
    runs = runs.sort_values(metric_col, ascending=False, na_position="last", kind="stable")
    logged = sorted(c[len("metrics.test/"):-len("/bleu")] for c in runs.columns
                    if c.startswith("metrics.test/") and c.endswith("/bleu"))
    shown_sets = [s for s in (test_sets or []) if s in logged] + [s for s in logged if s not in (test_sets or [])]
    nan = pd.Series(float("nan"), index=runs.index)
    table = pd.DataFrame({
        "run": runs["run_id"].str[:8],
        "name": runs.get("tags.mlflow.runName", pd.Series("", index=runs.index)),
        "status": runs["status"],
        ranking_column(metric): runs[metric_col].round(2),
    })
    if sweep:
        table.insert(2, "point", runs.get("tags.sweep.point", pd.Series("", index=runs.index)).fillna(""))
    for key in ("beam_size", "alpha"):   # chosen on val (the tune stage), as the evaluate stage decoded
        if f"tags.decoding.{key}" in runs.columns:
            table[f"val-chosen {key}"] = runs[f"tags.decoding.{key}"].fillna("")
    for name in shown_sets:
        table[f"test BLEU {name}"] = runs[f"metrics.test/{name}/bleu"].round(2)
        table[f"test chrF {name}"] = runs.get(f"metrics.test/{name}/chrf", nan).round(2)
    for name in logged_sets(runs, "dev", LITERATURE_KEY):   # reported beside the ranking, never ranking
        table[f"val BLEU lc.tok {name}"] = runs[f"metrics.dev/{name}/{LITERATURE_KEY}"].round(2)
    for name in [s for s in shown_sets if s in logged_sets(runs, "test", LITERATURE_KEY)]:
        table[f"test BLEU lc.tok {name}"] = runs[f"metrics.test/{name}/{LITERATURE_KEY}"].round(2)
    table["valid ppl"] = runs.get("metrics.valid/ppl", nan).round(2)
    for col in differing:
        table[col[len("params."):]] = runs[col]
    return table.reset_index(drop=True), [c[len("params."):] for c in differing]


def text_forms(column: pd.Series | None) -> list[str]:
    """The text forms in a ``tokenizer.text_form`` column of runs; a run from before the key (or no
    column at all), raw."""
    return sorted(set(column.fillna(RAW))) if column is not None else [RAW]


def common_measure(runs: pd.DataFrame, metric: str) -> str:
    """``metric``, unless it is ``valid_bleu`` and the runs trained on different text forms: then
    ``valid_bleu`` is sacreBLEU for some and ``bleu_lc_tok`` for others (``pipeline.scoring.measure``),
    and the validation ``bleu_lc_tok`` that every Multi30k run logs ranks them in one measure."""
    forms = text_forms(runs.get(f"params.{TEXT_FORM_PARAM}"))
    if metric != RANK_METRIC or len(forms) < 2:
        return metric
    sets = logged_sets(runs, "dev", LITERATURE_KEY)
    if len(sets) != 1:
        raise ValueError(f"the runs trained on text forms {', '.join(forms)}, so {RANK_METRIC} is not one "
                         f"measure across them, and no single validation set has {LITERATURE_KEY} to rank by "
                         f"(logged for: {', '.join(sets) or 'none'}); pass --metric dev/<set>/{LITERATURE_KEY}")
    return f"dev/{sets[0]}/{LITERATURE_KEY}"


def sweep_runs(experiment: str, sweep: str | None) -> pd.DataFrame:
    """Every run of ``experiment``, or only those tagged with ``sweep``."""
    if sweep:
        from pipeline.experiments.sweep_points import tagged_runs

        return tagged_runs(experiment, sweep)
    return mlflow.search_runs(experiment_names=[experiment], max_results=10_000)


def unfinished_points(sweep: str) -> list[str]:
    """A pool sweep's points whose newest flow run did not complete, with why (their state's
    message), from the Prefect server of ``PREFECT_API_URL``; [] without one (a local sweep)."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return []
    from pipeline.experiments.sweep_points import point_runs

    try:
        runs = point_runs(sweep)
    except Exception as err:   # noqa: BLE001 (the Prefect server away: the table still stands)
        print(f"warning: the sweep's flow runs could not be read from {PREFECT_API_URL.value()}: "
              f"{type(err).__name__}", file=sys.stderr)
        return []
    return [f"point {point}: {run.state}" + (f": {run.message}" if run.message else "")
            for point, run in sorted(runs.items()) if run.state != "COMPLETED"]


def logged_sets(runs: pd.DataFrame, role: str, key: str) -> list[str]:
    """The sets some run logged ``<role>/<set>/<key>`` for, sorted."""
    prefix, suffix = f"metrics.{role}/", f"/{key}"
    return sorted(c[len(prefix):-len(suffix)] for c in runs.columns if c.startswith(prefix) and c.endswith(suffix))


# Columns of text that look like numbers to tabulate: a run id such as "02608e68" would print as
# 2.608e+71 and "00012345" as 12345.
TEXT_COLUMNS = ("run", "name", "status")


def markdown_table(table: pd.DataFrame) -> str:
    """The table in markdown, its text columns printed verbatim (numbers still aligned and parsed)."""
    verbatim = [i for i, col in enumerate(table.columns) if col in TEXT_COLUMNS]
    return table.to_markdown(index=False, disable_numparse=verbatim)


def check_metric(metric: str) -> None:
    """Only development data ranks: a test set's metric is refused."""
    if metric.startswith("test/"):
        raise ValueError(f"--metric {metric} is a test score: test sets are reported, never used to rank "
                         f"(rank by {RANK_METRIC} or another validation metric)")


def ranking_column(metric: str) -> str:
    return f"{metric} (ranks)"


def plot_curves(experiment: str, run_ids: list[str], labels: list[str], path: Path) -> bool:
    """Validation perplexity against step, one line per run; False when no run has the curve."""
    c = store.client()
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for run_id, label in zip(run_ids, labels):
        history = c.get_metric_history(run_id, "valid/ppl")
        if history:
            history = sorted(history, key=lambda m: m.step)
            ax.plot([m.step for m in history], [m.value for m in history], marker="o", ms=3, label=label)
            drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xlabel("update step")
    ax.set_ylabel("validation perplexity")
    ax.set_yscale("log")
    ax.set_title(f"{experiment}: validation curves")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, lambda f: f.write(buffer.getvalue()))
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", help="MLflow experiment (default: tracking.experiment of params.yaml)")
    parser.add_argument("--sweep", help="only the runs of this sweep (make sweep's name), and its points that "
                                        "did not finish, with why")
    parser.add_argument("--metric", default=RANK_METRIC,
                        help=f"validation metric that ranks (default {RANK_METRIC}); test metrics are refused")
    args = parser.parse_args()
    try:
        check_metric(args.metric)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    from pipeline.tracking.preflight import require_tracking_server

    require_tracking_server()   # 401/403 or no answer: one line and exit 2, not a traceback
    params = load_params() if not args.experiment else None
    experiment = args.experiment or params.tracking.experiment
    try:
        table, differing = runs_table(experiment, args.metric, params.data.test_sets if params else None, args.sweep)
    except ValueError as err:   # runs of two text forms with no common validation measure
        parser.exit(2, f"error: {err}\n")
    unfinished = unfinished_points(args.sweep) if args.sweep else []
    if table.empty and not unfinished:
        print(f"no runs in experiment {experiment!r}" + (f" of sweep {args.sweep!r}" if args.sweep else "")
              + f" at {store.tracking_uri()}", file=sys.stderr)
        sys.exit(1)
    which = f"Runs of sweep {args.sweep} in {experiment}" if args.sweep else f"Runs of {experiment}"
    ranked = next((c for c in table.columns if c.endswith(" (ranks)")), ranking_column(args.metric))
    metric = ranked.removesuffix(" (ranks)")
    forms = (f"The runs trained on text forms {', '.join(text_forms(table.get(TEXT_FORM_PARAM)))} "
             f"(`{TEXT_FORM_PARAM}`): {RANK_METRIC} is sacreBLEU for raw text and {LITERATURE_KEY} for the "
             f"literature's, so {metric}, which each logged, ranks them in one measure.\n\n"
             if metric != args.metric else "")
    header = (f"# {which}, ranked by {metric} (validation); runs without it last\n\n"
              f"The column `{ranked}` ranks. Test scores are shown, never used to rank.\n\n" + forms +
              f"Params that differ between runs: {', '.join(differing) if differing else 'none'}\n\n")
    markdown = header + (markdown_table(table) if not table.empty else "(no run on the tracking server)") + "\n"
    if unfinished:
        markdown += "\nPoints that did not finish (their newest flow run):\n\n" + "".join(
            f"- {line}\n" for line in unfinished)
    print(markdown)
    full_ids = sweep_runs(experiment, args.sweep)["run_id"].tolist() if not table.empty else []
    by_prefix = {r[:8]: r for r in full_ids}
    labels = [f"{row['run']} " + " ".join(f"{p}={row[p]}" for p in differing) for _, row in table.iterrows()]
    if not table.empty and plot_curves(experiment, [by_prefix[r] for r in table["run"]], labels, PLOT):
        markdown += f"\n![validation curves]({PLOT.name})\n"
        print(f"validation curves: {PLOT}")
    write_text(REPORT, markdown)
    print(f"written: {REPORT}")


if __name__ == "__main__":
    main()
