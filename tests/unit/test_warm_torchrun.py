"""The warm torchrun's rank entry: `-m NAME` runs what `python -m NAME` would (a package's `__main__`),
and a rank that raises leaves its traceback on its stderr, as a fresh interpreter does on exit; the
agent imports what its run's workload and data set need before it forks, and what the finetune ranks need
for their run's plan (a pipeline's stages), and torch's dynamo, which every rank's optimiser imports, once
for several ranks; neither a finetune rank nor the evaluate
process imports torch.distributed.pipelining at import (read from the sources' module-level imports)."""

from __future__ import annotations

import ast
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pipebd_core.finetune import __main__ as finetune_rank
from pipebd_core.job import forked, warm_torchrun
from pipebd_core.rank.process import preload
from pipebd_core.rundir import RunDir
from pipebd_core.workloads.builders import DATASET_MODULES
from tests.helpers import ROOT, tiny_document
from tests.unit.plan_samples import FINETUNE_SAMPLE


def test_a_package_runs_its_main_module_and_a_module_itself() -> None:
    assert forked.rank_module("pipebd_core.distill").__name__ == "pipebd_core.distill.__main__"
    assert forked.rank_module("pipebd_core.distill.finalize").__name__ == "pipebd_core.distill.finalize"


def test_a_rank_that_raises_prints_its_traceback_and_gets_fresh_signal_handlers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    handlers: dict[int, object] = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))

    def main(argv: list[str]) -> None:
        raise RuntimeError(f"rank failed with {argv}")

    monkeypatch.setitem(sys.modules, "crashing_rank", types.SimpleNamespace(main=main))
    with pytest.raises(RuntimeError):
        warm_torchrun.run_rank("crashing_rank", ["--run-dir", "x"])
    assert "RuntimeError: rank failed with ['--run-dir', 'x']" in capsys.readouterr().err
    assert handlers == {
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGINT: signal.default_int_handler,
        signal.SIGHUP: signal.SIG_DFL,
        signal.SIGQUIT: signal.SIG_DFL,
    }


def run_dir_of(tmp_path: Path, name: str, **sections: dict[str, Any]) -> RunDir:
    run_dir = RunDir(tmp_path / name)
    run_dir.write_json(run_dir.spec, tiny_document(**sections))
    return run_dir


def test_the_agent_preloads_what_the_workload_and_the_data_set_of_its_run_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ranks would each import again after the fork (torchvision, scikit-learn) is imported once,
    by the module that builds it; a module that does not import is left for the ranks to report."""
    nas = run_dir_of(tmp_path, "nas", workload={"kind": "nas", "factory": None}, data={"image_size": 32})
    assert preload(nas) == ["pipebd_core.workloads.nas"]
    digits = run_dir_of(tmp_path, "digits", data={"dataset": "digits"})
    assert preload(digits) == ["pipebd_core.workloads.custom", "pipebd_core.data.digits"]
    assert {"pipebd_core.workloads.nas", "pipebd_core.data.digits"} <= set(sys.modules)
    monkeypatch.setitem(DATASET_MODULES, "digits", "pipebd_core.data.no_such_module")
    assert preload(digits) == ["pipebd_core.workloads.custom"]


def test_the_finetune_agent_preloads_a_pipelines_stages_and_not_for_ddp(tmp_path: Path) -> None:
    """torch.distributed.pipelining is imported by the agent for a pipeline's ranks, by no DDP rank and by no
    evaluate process; an unreadable plan is left for the ranks to report."""
    pipelined = run_dir_of(tmp_path, "gpipe")
    pipelined.write_json(pipelined.finetune_plan, FINETUNE_SAMPLE.model_dump(mode="json"))
    assert finetune_rank.preload(pipelined) == [finetune_rank.PIPELINE] and finetune_rank.PIPELINE in sys.modules
    ddp = run_dir_of(tmp_path, "ddp")
    update = {"strategy": "ddp", "nproc": 2, "microbatches": 1, "stages": [(0, 5)]}
    ddp.write_json(ddp.finetune_plan, FINETUNE_SAMPLE.model_copy(update=update).model_dump(mode="json"))
    assert finetune_rank.preload(ddp) == []
    assert finetune_rank.preload(run_dir_of(tmp_path, "no-plan")) == []
    for program in ("pipebd_core.finetune.__main__", "pipebd_core.finetune.evaluate"):
        assert "torch.distributed.pipelining" not in loaded_at_import(program), program
    assert "torch.distributed.pipelining" in loaded_at_import(finetune_rank.PIPELINE)  # the check sees it


PACKAGES = ROOT / "pipebd_core"


def module_level_imports(name: str) -> set[str]:
    """What importing `name` (a pipebd_core module) imports by itself: its module-level imports (also in a
    try block; not in a function, nor under `if TYPE_CHECKING`), `from X import y` as X and X.y."""
    path = PACKAGES.parent / (name.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    nodes = []
    for node in ast.parse(path.read_text()).body:
        nodes += [node, *(node.body if isinstance(node, ast.Try) else [])]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def loaded_at_import(name: str) -> set[str]:
    """Every module importing `name` loads, following pipebd_core's own modules (and their packages)."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        if parts[0] != "pipebd_core":
            continue
        on_disk = PACKAGES.parent / "/".join(parts)
        if not (on_disk.with_suffix(".py").exists() or (on_disk / "__init__.py").exists()):
            continue  # `from module import function`: not a module
        todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(module_level_imports(module))
    return seen


def test_an_agent_of_several_ranks_imports_what_every_ranks_optimiser_imports() -> None:
    """torch imports its dynamo (1.3 s of CPU) when a rank builds its optimiser: an agent of several ranks
    imports it once before the fork; one of a single rank leaves it to the rank."""
    assert warm_torchrun.for_every_rank(1) == []
    assert warm_torchrun.for_every_rank(2) == [forked.DYNAMO] and forked.DYNAMO in sys.modules
