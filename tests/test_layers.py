"""The import graph of kvstored points one way (docs: DESIGN.md section 10).

Every module under kvstored/ (the generated kvstored/v1 excluded) is parsed with ``ast``; an
edge is any ``import``/``from ... import`` of a kvstored module, wherever it stands (module
level, inside a function, under ``TYPE_CHECKING``): a deferred or type-only import is still a
dependency. ``from kvstored.x import y`` counts as importing ``kvstored.x`` (and, when ``y`` is
itself a module, ``kvstored.x.y``).

Checked:

- no module of kvstored/transport imports kvstored.node or kvstored.tiers;
- no module outside kvstored/cli imports kvstored.cli;
- the leaves (types, keys, errors, units, clock, addresses, config, log) import only other
  leaves, and no gRPC;
- ``import kvstored`` (a fresh interpreter) loads no kvstored.client or kvstored.transport
  module, and ``import kvstored.errors`` loads no gRPC.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvstored"
LEAVES = ("types", "keys", "errors", "units", "clock", "addresses", "config", "log", "tenancy")


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {
        _module_name(p): p
        for p in sorted(PACKAGE.rglob("*.py"))
        if "v1" not in p.relative_to(PACKAGE).parts[:1]
    }


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """``(line, imported kvstored module)`` for every import statement in one module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield node.lineno, f"{base}.{alias.name}"


def _graph() -> dict[str, list[tuple[int, str]]]:
    return {
        name: [(line, target) for line, target in _imports(name, path)
               if target == "kvstored" or target.startswith("kvstored.")]
        for name, path in MODULES.items()
    }


GRAPH = _graph()


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(sources: Callable[[str], bool], forbidden: tuple[str, ...]) -> list[str]:
    """``"path:line imports target"`` for each edge from a module ``sources`` accepts into a
    package of ``forbidden``."""
    found = []
    for name, edges in GRAPH.items():
        if not sources(name):
            continue
        for line, target in edges:
            if any(_is_under(target, f) for f in forbidden):
                found.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}")
    return sorted(set(found))


def test_the_graph_covers_the_package() -> None:
    # a parser that finds nothing would pass every check below
    assert "kvstored.transport.tcp" in GRAPH and "kvstored.errors" in GRAPH
    assert any(t == "kvstored.errors" for _, t in GRAPH["kvstored.transport.tcp"])
    assert not any(_is_under(m, "kvstored.v1") for m in GRAPH)


def test_transport_imports_neither_node_nor_tiers() -> None:
    bad = _violations(lambda m: _is_under(m, "kvstored.transport"), ("kvstored.node", "kvstored.tiers"))
    assert not bad, "transport/ must not depend on node/ or tiers/:\n" + "\n".join(bad)


def test_only_cli_imports_cli() -> None:
    bad = _violations(lambda m: not _is_under(m, "kvstored.cli"), ("kvstored.cli",))
    assert not bad, "only kvstored/cli may import kvstored.cli:\n" + "\n".join(bad)


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_only_leaves(leaf: str) -> None:
    name = f"kvstored.{leaf}"
    allowed = {f"kvstored.{other}" for other in LEAVES}
    bad = [f"line {line}: {target}" for line, target in GRAPH[name] if target not in allowed]
    assert not bad, f"{name} is a leaf; it imports a layer above it: {bad}"
    third_party = {t.partition(".")[0] for _, t in _imports(name, MODULES[name])}
    assert "grpc" not in third_party, f"{name} is a leaf and must not import grpc"


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT, check=True)
    return list(json.loads(out.stdout))


def test_importing_the_package_loads_no_client_and_no_transport() -> None:
    loaded = _loaded_after("import kvstored")
    assert "kvstored" in loaded
    bad = [m for m in loaded if _is_under(m, "kvstored.client") or _is_under(m, "kvstored.transport")]
    assert not bad, f"`import kvstored` loaded {bad}"


def test_importing_the_errors_loads_no_grpc() -> None:
    loaded = _loaded_after("import kvstored.errors")
    assert "kvstored.errors" in loaded
    assert "grpc" not in loaded


def test_the_package_still_exports_its_public_names() -> None:
    import kvstored

    assert kvstored.__all__ == sorted([*kvstored._LAZY, "__version__"])
    namespace: dict[str, object] = {}
    exec("from kvstored import *", namespace)  # noqa: S102
    missing = [n for n in kvstored.__all__ if namespace.get(n) is None]
    assert not missing, missing
    from kvstored import Client, native  # a lazy name and a plain submodule

    assert Client.__module__ == "kvstored.client.sync" and native.__name__ == "kvstored.native"
    with pytest.raises(AttributeError, match="no_such_name"):
        kvstored.no_such_name  # noqa: B018
