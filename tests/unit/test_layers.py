"""The engine's floors: no module of pipebd_core imports from a floor above its own, and no phase's rank
program imports another's. Read from the source (every import, those inside functions too), so a planted
upward import fails here before any rank runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "pipebd_core"

# lowest first; a package may import its own floor and the floors below, never one above. The rank
# programs of the phases share a floor and none imports another (PHASES); the host side likewise shares one.
FLOORS: list[tuple[str, ...]] = [
    ("spec", "spec_checks", "rundir", "documents", "imports", "figures", "devices"),
    ("data", "workloads"),
    ("rank",),
    ("distill", "finetune", "profile"),
    ("planning",),
    ("job", "bench", "tracking"),
    ("cli", "commands", "what_if", "__main__"),
]
PHASES = {"distill", "finetune", "profile"}
WITHIN_FLOOR = {("data", "workloads"), ("workloads", "data")}  # what is learned: a workload reads its data set


def floor_of(unit: str) -> int:
    for level, units in enumerate(FLOORS):
        if unit in units:
            return level
    raise AssertionError(f"pipebd_core.{unit} is on no floor: add it to FLOORS in {__file__}")


def unit_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "pipebd_core" and len(parts) > 1 else None


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, `from X import y` as both X and X.y."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(unit: str, source: str) -> list[str]:
    """The imports of a module of `unit` that run upward, or from one phase's program into another's."""
    bad = []
    for line, module in imported_modules(source):
        other = unit_of(module)
        if other is None or other == unit or other == "__init__":
            continue
        if (unit, other) in WITHIN_FLOOR:
            continue
        mine, theirs = floor_of(unit), floor_of(other)
        if theirs > mine or (theirs == mine and unit in PHASES and other in PHASES):
            bad.append(f"line {line}: pipebd_core.{unit} imports {module}")
    return bad


def modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def unit_of_path(path: Path) -> str:
    relative = path.relative_to(ROOT)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 else relative.stem


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_imports_from_a_floor_above_its_own(path: Path) -> None:
    unit = unit_of_path(path)
    if unit == "__init__":
        return
    assert violations(unit, path.read_text()) == [], f"{path.relative_to(ROOT.parent)} imports upward"


def test_a_planted_upward_import_is_found() -> None:
    assert violations("rank", "from pipebd_core.distill.runtime import Trainer\n") == [
        "line 1: pipebd_core.rank imports pipebd_core.distill.runtime",
        "line 1: pipebd_core.rank imports pipebd_core.distill.runtime.Trainer",
    ]
    inside = "def f():\n    from pipebd_core.job import control\n"
    assert violations("workloads", inside) == [
        "line 2: pipebd_core.workloads imports pipebd_core.job",
        "line 2: pipebd_core.workloads imports pipebd_core.job.control",
    ]
    assert violations("finetune", "import pipebd_core.profile.layers\n") != []  # one phase's program into another's
    assert violations("planning", "from pipebd_core.distill.plan import Plan\n") == []  # downward is fine


def test_every_package_is_on_a_floor() -> None:
    units = {unit_of_path(path) for path in modules()} - {"__init__"}
    for unit in units:
        floor_of(unit)
