"""The layout docs/ARCHITECTURE.md describes, held against the code.

The import graph is read from the source (every ``import`` and ``from ...
import``, also those under ``TYPE_CHECKING`` and inside functions), so a loop
that only the type checker or a lazy import would close is still a loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dtlaunch"

# One cohesive state machine may be long (docs/ARCHITECTURE.md names it).
LONG_STATE_MACHINES = {
    "dtlaunch.supervisor.jobstate.machine",
    "dtlaunch.supervisor.rna.coordinator",
}
MAX_MODULE_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the dtlaunch modules it imports (a ``from pkg import sub`` of a
    submodule counts as importing the submodule, not the package face)."""
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in modules else source)
        graph[name] = {
            t
            for t in (_resolve(x, modules) for x in targets if x.startswith("dtlaunch"))
            if t is not None and t != name
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_loop_through_a_type_only_import(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_loop_between_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])


def test_the_supervisor_folder_has_at_most_12_modules_at_its_top():
    top = sorted(p.name for p in (PACKAGE / "supervisor").glob("*.py"))
    assert len(top) <= 12, top


def test_no_module_is_longer_than_600_lines_but_the_named_state_machines():
    long = {
        name: n
        for name, path in all_modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
        and name not in LONG_STATE_MACHINES
    }
    assert not long, long


def test_every_package_has_a_face_that_says_what_it_holds():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} needs a docstring"


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("dtlaunch.wire", ("dtlaunch.supervisor", "dtlaunch.runtime", "dtlaunch.ps")),
        ("dtlaunch.solvers", ("dtlaunch.supervisor", "dtlaunch.wire", "dtlaunch.runtime")),
        ("dtlaunch.supervisor.jobstate", ("dtlaunch.supervisor.supervisor",)),
        ("dtlaunch.supervisor.control", ("dtlaunch.supervisor.supervisor",)),
    ],
)
def test_dependencies_point_down(module, forbidden):
    """The wire knows no policy; solvers are pure; state machines know no loop."""
    graph = import_graph()
    bad = {
        (src, dst)
        for src, targets in graph.items()
        if src == module or src.startswith(module + ".")
        for dst in targets
        if any(dst == f or dst.startswith(f + ".") for f in forbidden)
    }
    assert not bad, sorted(bad)


def test_the_architecture_doc_names_every_package():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(
        module_name(p).removeprefix("dtlaunch.").replace(".", "/") + "/"
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    )
    missing = [p for p in packages if p not in doc]
    assert not missing, f"docs/ARCHITECTURE.md does not describe {missing}"
