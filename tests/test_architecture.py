"""The import rule of docs/architecture.md, checked on the source: a module imports only from its own
layer or lower ones, the algorithm layers import no framework, and no two modules import each other
(directly or around a longer loop), counting imports inside functions too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "envace"

#: package -> layer (docs/architecture.md); ``envace`` itself (the version) is the root, importable by all.
LAYERS = {"envace": 0, "common": 0, "core": 1, "bench": 2, "serve": 3, "train": 4, "report": 5, "cli": 6}
#: frameworks the lower layers must not import (at module level or inside a function).
FRAMEWORKS = {"torch", "transformers", "verl", "vllm", "ray", "snakemake", "matplotlib", "seaborn"}
FRAMEWORK_FREE = ("common", "core", "bench")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(envace modules imported, top-level names of other packages imported) by the file at ``path``."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "envace":
                others.add(node.module.split(".")[0])
                continue
            for alias in node.names:  # ``from envace.x import y`` may name a submodule y
                sub = f"{node.module}.{alias.name}"
                ours.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import (the rule is checked on absolute imports)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                (ours.add(alias.name) if top == "envace" else others.add(top))
    return ours, others


def _layer(module: str) -> tuple[str, int]:
    package = module.split(".")[1] if "." in module else "envace"
    assert package in LAYERS, f"{module}: package {package!r} has no layer in docs/architecture.md"
    return package, LAYERS[package]


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    ours, others = {}, {}
    for name, path in modules.items():
        ours[name], others[name] = _imports(path, modules)
    return ours, others


def test_every_import_goes_to_the_same_or_a_lower_layer():
    ours, _ = _graph()
    bad = []
    for module, targets in ours.items():
        package, layer = _layer(module)
        for target in targets:
            t_package, t_layer = _layer(target)
            if not (t_package in (package, "envace") or t_layer < layer):
                bad.append(f"{module} ({package}, layer {layer}) imports {target} "
                           f"({t_package}, layer {t_layer})")
    assert not bad, "\n".join(sorted(bad))


def test_the_algorithm_layers_import_no_framework():
    _, others = _graph()
    bad = [f"{m} imports {sorted(others[m] & FRAMEWORKS)}" for m in others
           if _layer(m)[0] in FRAMEWORK_FREE and others[m] & FRAMEWORKS]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle():
    ours, _ = _graph()
    # a package's __init__ is imported with each of its modules: an edge to a package counts as one to it
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(ours.get(node, ())):
            if nxt == node or nxt == "envace":
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(ours):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("check", ["layer", "cycle"])
def test_the_checks_see_a_violation(tmp_path, monkeypatch, check):
    """Not vacuous: a core module importing the CLI, and two modules importing each other, are found."""
    pkg = tmp_path / "envace"
    for sub in ("core", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    if check == "layer":
        (pkg / "core" / "a.py").write_text("from envace.cli.b import x\n")
        (pkg / "cli" / "b.py").write_text("x = 1\n")
        test = test_every_import_goes_to_the_same_or_a_lower_layer
    else:
        (pkg / "core" / "a.py").write_text("def f():\n    from envace.core.b import y\n")
        (pkg / "core" / "b.py").write_text("from envace.core.a import f\ny = 1\n")
        test = test_no_import_cycle
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    with pytest.raises(AssertionError):
        test()
