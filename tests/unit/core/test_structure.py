"""The core's own shape: its modules import one another without a cycle
(imports under TYPE_CHECKING or inside functions count too), none uses
another's private (underscored) names, and none passes 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "core"


def core_imports(path: Path) -> tuple[set[str], set[str]]:
    """The core modules ``path`` imports, and the private names it imports from them."""
    modules: set[str] = set()
    private: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "core":
                modules.update(alias.name for alias in node.names)
            elif node.module.startswith("core."):
                modules.add(node.module.split(".")[1])
                private.update(f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_"))
        elif isinstance(node, ast.Import):
            modules.update(a.name.split(".")[1] for a in node.names if a.name.startswith("core."))
    return modules, private


GRAPH = {path.stem: core_imports(path) for path in sorted(CORE.glob("*.py"))}


def test_core_modules_import_one_another_without_a_cycle() -> None:
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join(path + (module,))
        if module in done:
            return
        for imported in sorted(GRAPH.get(module, (set(), set()))[0]):
            visit(imported, path + (module,))
        done.add(module)

    for module in GRAPH:
        visit(module, ())
    assert "broker" not in GRAPH["clients"][0]  # the client reaches the broker through core.clients.Core


def test_no_core_module_imports_another_modules_private_names() -> None:
    assert {module: private for module, (_, private) in GRAPH.items() if private} == {}


def test_no_core_module_uses_a_private_attribute_of_another_object() -> None:
    found = []
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert found == []


def test_core_modules_stay_under_500_lines() -> None:
    assert {p.name: n for p in CORE.glob("*.py") if (n := len(p.read_text().splitlines())) > 500} == {}
