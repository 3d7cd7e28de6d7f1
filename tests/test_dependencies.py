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
from collections.abc import Iterator
from pathlib import Path

import yaml

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


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs: at module level and inside functions, not under ``if TYPE_CHECKING``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def lazy_names(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {name: submodule} of packages that load their names on first use (a ``_LAZY``
    table and a module ``__getattr__``, as ``transformer/__init__.py``)."""
    tables = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                    tables[name] = {k: f"{name}.{v}" for k, v in ast.literal_eval(node.value).items()}
    return tables


def imports_of(name: str, path: Path, modules: dict[str, Path],
               lazy: dict[str, dict[str, str]] | None = None) -> set[str]:
    """Repository modules that module ``name`` imports explicitly (submodules named in
    ``from package import submodule`` included, and the module a lazy package loads a name from)."""
    lazy = lazy or {}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                       else lazy.get(base, {}).get(a.name, base) for a in node.names]
        for target in targets:
            while target and target not in modules:      # `import pipeline.data.x.y` style: nearest module
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found - {name}


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

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones():
    graph = import_graph()
    assert "pipeline.data.registry" in graph["pipeline.config.params"]
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
