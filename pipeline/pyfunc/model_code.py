"""The code a logged pyfunc model needs when it is loaded: the files of the repository's packages
that loading the model (MLflow running ``pipeline/pyfunc/mlflow_model_code.py``, which imports the
model class) and its ``load_context``/``predict`` import, found in
their source (every ``import`` at module level or inside a function, not under ``if TYPE_CHECKING``;
the rules of ``tests/test_dependencies.py``'s import graph), and nothing else.

A model logged with whole package folders as ``code_paths`` uploads every file of them, one request
each (~150 on a team's server); the closure of the translator is a fifth of that. ``stage`` copies
the closure into a folder laid out as the packages are, whose package folders are the model's
``code_paths``: ``mlflow.pyfunc.load_model`` puts their parent first on ``sys.path``.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("pipeline", "transformer")
REPO = Path(__file__).resolve().parents[2]


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``PACKAGES`` under ``root``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, into_functions: bool = True) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run: at module level and (``into_functions``) inside functions and classes."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            elif into_functions or not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.append(child)


def _lazy(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {name: submodule} of packages that load names on first use (a ``_LAZY`` table)."""
    tables = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
                    tables[name] = {k: f"{name}.{v}" for k, v in ast.literal_eval(node.value).items()}
    return tables


def _targets(name: str, path: Path, nodes: Iterator[ast.Import | ast.ImportFrom], modules: dict[str, Path],
             lazy: dict[str, dict[str, str]]) -> set[str]:
    """The repository modules ``nodes`` (imports of module ``name``) import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[:len(anchor) - (node.level - 1)] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else lazy.get(base, {}).get(a.name, base)
                       for a in node.names]
        for target in targets:
            while target and target not in modules:   # `import a.b.c.name`: the nearest module
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found - {name}


def closure(module: str, cls: str, root: Path = REPO) -> list[Path]:
    """The files (relative to ``root``) that loading class ``cls`` of ``module`` and calling its
    methods runs: ``module`` with its module-level imports and those inside ``cls`` (not those of
    its other functions, which the loaded model never calls), then
    every import of those, recursively, and each package ``__init__`` on the way."""
    modules = _modules(root)
    lazy = _lazy(modules)
    tree = ast.parse(modules[module].read_text(encoding="utf-8"))
    (body,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    todo = list(_targets(module, modules[module], _imports(tree, into_functions=False), modules, lazy)
                | _targets(module, modules[module], _imports(body), modules, lazy))
    seen = {module}
    todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo += _targets(name, modules[name], _imports(ast.parse(modules[name].read_text(encoding="utf-8"))),
                         modules, lazy)
    return sorted(modules[name].relative_to(root) for name in seen)


def stage(module: str, cls: str, into: Path, root: Path = REPO) -> list[str]:
    """Copy ``closure(module, cls)`` into ``into`` (package layout kept, with the data files beside
    the modules of each copied folder: ``pipeline/data/checksums.json``); returns the package folders
    to log as the model's ``code_paths``."""
    folders = set()
    for relative in closure(module, cls, root):
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, target)
        folders.add(relative.parent)
    for folder in folders:
        for data in (root / folder).iterdir():
            if data.is_file() and data.suffix not in (".py", ".pyc"):
                shutil.copy2(data, into / folder / data.name)
    return [str(into / package) for package in PACKAGES if (into / package).is_dir()]
