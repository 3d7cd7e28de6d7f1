"""The repository's import graph: no cycle anywhere, and each DVC stage depends on exactly the files
it runs (its import closure inside the repository), so that editing a file reruns exactly the
stages that run it (decoding code is evaluate's, not train's).

``python -m tests.test_dependencies`` prints each stage's closure, the lists ``dvc.yaml`` must hold
(``--write`` puts them there).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.pyfunc.model_code import _imports, _lazy, _targets

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "transformer")


def repo_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the repository's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def lazy_names(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {name: submodule} of packages that load their names on first use (a ``_LAZY``
    table and a module ``__getattr__``, as ``transformer/__init__.py``)."""
    return _lazy(modules)


def imports_of(name: str, path: Path, modules: dict[str, Path],
               lazy: dict[str, dict[str, str]] | None = None) -> set[str]:
    """Repository modules that module ``name`` imports explicitly, at module level and inside
    functions, not under ``if TYPE_CHECKING`` (the walker the registered model's code list uses)."""
    return _targets(name, path, _imports(ast.parse(path.read_text(encoding="utf-8"))), modules, lazy or {})


def import_graph() -> dict[str, set[str]]:
    modules = repo_modules()
    lazy = lazy_names(modules)
    return {name: imports_of(name, path, modules, lazy) for name, path in modules.items()}


def closure_files(root: str, graph: dict[str, set[str]], modules: dict[str, Path]) -> set[str]:
    """Files that run when ``root`` runs: its imports, recursively, and every package ``__init__``
    on their way (importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules)
        todo.extend(graph[name])
    return {modules[name].relative_to(REPO).as_posix() for name in seen}


def stage_modules() -> dict[str, str]:
    """DVC stage -> the module its ``cmd`` runs (``python -m <module>``)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    found = {}
    for stage, spec in stages.items():
        match = re.search(r"python -m ([\w.]+)", spec["cmd"])
        assert match, f"dvc.yaml: stage {stage} does not run `python -m <module>`: {spec['cmd']}"
        found[stage] = match.group(1)
    return found


def expected_deps() -> dict[str, set[str]]:
    modules = repo_modules()
    graph = import_graph()
    return {stage: closure_files(module, graph, modules) for stage, module in stage_modules().items()}


def test_no_import_cycle_anywhere():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:   # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        on_stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = on_stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    # Restored after the test: a limit left raised changes what other tests in this process see
    # (JSON nested 2,000 deep parses instead of failing).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(10_000, limit))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones():
    graph = import_graph()
    assert "pipeline.data.registry" in graph["pipeline.config.data"]
    assert "pipeline.config.params" not in graph["pipeline.data.corpus"]   # an `if TYPE_CHECKING:` import


def test_dvc_stage_deps_are_exactly_their_import_closure():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    expected = expected_deps()
    for stage, spec in stages.items():
        listed = {d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])}
        code = {d for d in listed if d.split("/")[0] in PACKAGES}
        assert code == expected[stage], (
            f"dvc.yaml stage {stage}: missing {sorted(expected[stage] - code)}, extra {sorted(code - expected[stage])}")


def test_decoding_code_is_evaluates_not_trains():
    expected = expected_deps()
    assert "transformer/search.py" not in expected["train"]
    assert "transformer/search.py" in expected["evaluate"]


def import_chain(root: str, target: str, graph: dict[str, set[str]], modules: dict[str, Path]) -> str:
    """The shortest chain of imports by which running ``root`` runs ``target`` (a failure's why)."""
    before: dict[str, str | None] = {root: None}
    todo = [root]
    while todo and target not in before:
        name = todo.pop(0)
        parts = name.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules}
        for nxt in sorted(graph[name] | parents):
            if nxt not in before:
                before[nxt] = name
                todo.append(nxt)
    chain, name = [], target
    while name is not None:
        chain.append(name)
        name = before.get(name)
    return " -> ".join(reversed(chain))


def module_of(file: str) -> str:
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def assert_not_run_by(files: list[str], stages: tuple[str, ...]) -> None:
    """None of ``files`` is in the import closure of any of ``stages`` (each failure with its chain)."""
    modules, graph, expected = repo_modules(), import_graph(), expected_deps()
    found = [f"{stage} runs {file}: {import_chain(stage_modules()[stage], module_of(file), graph, modules)}"
             for stage in stages for file in files if file in expected[stage]]
    assert not found, "\n".join(found)


# The model and its training: an edit reruns train and the stages after it, never the data stages.
MODEL_AND_TRAINING = [f"transformer/{name}.py" for name in (
    "config", "attention", "layers", "model", "positional", "dropout", "precision", "search",
    "training/train_config", "training/loss", "training/schedule", "training/trainer", "training/batching")]
# Decoding-only code (beam search, the translator and its settings, decoding a split, scoring it): an
# edit reruns tune and evaluate, never training or averaging.
DECODING = ["transformer/search.py", "transformer/packed.py", "pipeline/config/decoding.py",
            "pipeline/serving/decoding.py",
            "pipeline/serving/translator.py", "pipeline/serving/stage_translator.py",
            "pipeline/scoring/sacrebleu_scores.py", "pipeline/scoring/paper_bleu.py"]


def test_model_and_training_code_reruns_train_or_later_only():
    assert_not_run_by(MODEL_AND_TRAINING, ("download", "tokenizer"))
    expected = expected_deps()
    for file in MODEL_AND_TRAINING:
        assert any(file in expected[stage] for stage in ("train", "average", "tune", "evaluate")), file


def test_decoding_code_reruns_tune_and_evaluate_only():
    assert_not_run_by(DECODING, ("download", "tokenizer", "train", "average"))
    expected = expected_deps()
    for file in DECODING:
        assert file in expected["tune"] or file in expected["evaluate"], file


def test_a_stage_runs_no_other_stage_module():
    """Helpers two stages share live outside the stage modules: a stage's edit reruns that stage alone."""
    modules, graph, stages = repo_modules(), import_graph(), stage_modules()
    for stage, module in stages.items():
        for other_stage, other in stages.items():
            if other != module:
                chain = import_chain(module, other, graph, modules)
                assert not chain.startswith(module), f"{stage} runs stage {other_stage}'s module: {chain}"


def test_the_stage_runner_loads_no_model_or_schema_code():
    """Every stage runs ``run_stage``: the errors it catches come from modules that define errors alone."""
    modules, graph = repo_modules(), import_graph()
    runner = closure_files("pipeline.stages.runner", graph, modules)
    heavy = {f for f in runner if f.startswith(("transformer/", "pipeline/config/"))} - {
        "transformer/__init__.py", "transformer/errors.py", "pipeline/config/__init__.py", "pipeline/config/errors.py"}
    assert not heavy, f"pipeline/stages/runner.py runs {sorted(heavy)}"


def test_the_model_imports_nothing_of_its_training():
    """``transformer``'s top (the model, decoding, checkpoints, the tokenizer) runs without
    ``transformer/training/``: a user of the model, and the serving and decoding stages, load none of it."""
    graph = import_graph()
    top = [name for name in graph if name.startswith("transformer") and not name.startswith("transformer.training")]
    assert "transformer.model" in top and "transformer.search" in top
    for name in top:
        assert not {t for t in graph[name] if t.startswith("transformer.training")}, name
    assert "transformer.training.trainer" in graph


# ``pipeline/``'s folders, those that run things first (docs/architecture.md): a module imports only its own
# folder and the folders after its own. A helper two folders share lives in the lower one.
FOLDER_ORDER = ("workers", "flows", "experiments", "stages", "figures", "pyfunc", "serving", "tracking",
                "scoring", "config", "text", "data", "stack")


def pipeline_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 else None


def test_pipeline_folders_import_only_the_folders_after_their_own():
    graph = import_graph()
    folders = {d.name for d in (REPO / "pipeline").iterdir() if (d / "__init__.py").is_file()}
    assert folders == set(FOLDER_ORDER), f"pipeline/ has folders {sorted(folders)}; FOLDER_ORDER {FOLDER_ORDER}"
    rank = {folder: i for i, folder in enumerate(FOLDER_ORDER)}
    against = set()
    for name, targets in graph.items():
        own = pipeline_folder(name)
        for target in targets:
            theirs = pipeline_folder(target)
            if own and theirs and rank[theirs] < rank[own]:
                against.add((name, target))
    assert not against, f"imports against pipeline/'s folder order (FOLDER_ORDER): {sorted(against)}"


def test_the_replay_runs_by_name_only_the_senders_it_names():
    """The unsent queue's replay (``tracking/unsent/deferred.py``) runs any stage's sender, imported by
    the name ``SENDERS`` gives it, not by an import statement: a stage imports its own sender only, so
    its DVC deps hold no other stage's code. The evaluate stage's sender registers the pyfunc model
    (``pyfunc/``, before ``tracking`` in the order): the one name of the replay's that reaches up."""
    import ast

    tree = ast.parse((REPO / "pipeline/tracking/unsent/deferred.py").read_text())
    senders = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "SENDERS" for t in node.targets))
    rank = {folder: i for i, folder in enumerate(FOLDER_ORDER)}
    graph = import_graph()
    assert set(senders.values()) <= set(graph), "every sender is a module of the repository"
    up = {name for name in senders.values() if rank[pipeline_folder(name)] < rank["tracking"]}
    assert up == {"pipeline.pyfunc.evaluate_record"}


def rewrite_dvc_yaml() -> None:
    """Replace each stage's code deps in ``dvc.yaml`` by its import closure, in place, keeping the
    other deps, the comments and the order of everything else."""
    path = REPO / "dvc.yaml"
    expected = expected_deps()
    out: list[str] = []
    stage = None
    written = False
    for line in path.read_text().splitlines(keepends=True):
        match = re.match(r"^  (\w+):\s*$", line)
        if match:
            stage, written = match.group(1), False
        code = re.match(r"^(\s+)- ((?:pipeline|transformer)/\S+)\s*$", line)
        if stage in expected and code:
            if not written:
                out.extend(f"{code.group(1)}- {file}\n" for file in sorted(expected[stage]))
                written = True
            continue
        out.append(line)
    path.write_text("".join(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:   # python -m tests.test_dependencies --write: dvc.yaml's code deps updated
        rewrite_dvc_yaml()
    for stage, files in expected_deps().items():
        print(f"{stage}:")
        for file in sorted(files):
            print(f"      - {file}")
