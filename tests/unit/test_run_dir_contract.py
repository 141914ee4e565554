"""The run-directory contract: no module but pipebd_core/rundir.py joins a run directory's names onto a path.

Every file and folder a job writes is named once, in `RunDir`; a module that writes
`root / "summary.json"` or `folder / f"rank-{r}.log"` itself would drift from it unseen. This reads the
source (AST) of the engine, the service and the workers and fails on any such join.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pipebd_core.rundir import OUTPUTS

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "pipebd_core" / "rundir.py"
PACKAGES = ("pipebd_core", "app", "worker")
# names of a run directory's entries besides its documented outputs
FOLDERS = (
    "checkpoints",
    "control",
    "logs",
    "metrics",
    "errors",
    "stopped",
    "finetune",
    "stop.json",
    "stop_at.json",
    "tensorboard",
    "teacher_model",
    "distilled_hf",
    "searched_hf",
    "finetuned_hf",
)
PATTERN = re.compile(r"^(rank|block|step)-")  # rank-<r>.log, block-<i>/, step-<s>.pt
NAMES = {output.name for output in OUTPUTS} | set(FOLDERS)


def literal_head(node: ast.expr) -> str | None:
    """The text a string or f-string operand starts with (None for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def run_dir_joins(source: str) -> list[tuple[int, str]]:
    """(line, name) of every `path / "<run-directory name>"` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            head = literal_head(node.right)
            if head is not None and (head in NAMES or PATTERN.match(head)):
                found.append((node.lineno, head))
    return sorted(found)


def test_only_the_contract_joins_run_directory_names() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: / {name!r}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path != CONTRACT
        for line, name in run_dir_joins(path.read_text())
    ]
    assert offenders == [], "use a RunDir path instead:\n" + "\n".join(offenders)


def test_the_check_sees_a_join_written_outside_the_contract() -> None:
    source = 'root = Path(job.run_dir)\nsummary = root / "summary.json"\nlog = root / "logs" / f"rank-{rank}.log"\n'
    assert run_dir_joins(source) == [(2, "summary.json"), (3, "logs"), (3, "rank-")]
    assert run_dir_joins('report = out / "bench.json"\n') == []
