"""The warm torchrun's rank entry: `-m NAME` runs what `python -m NAME` would (a package's `__main__`),
and a rank that raises leaves its traceback on its stderr, as a fresh interpreter does on exit; the
agent imports what its run's workload and data set need before it forks."""

from __future__ import annotations

import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pipebd_core.data.datasets import DATASET_MODULES
from pipebd_core.job import warm_torchrun
from pipebd_core.rank.process import preload
from pipebd_core.rundir import RunDir
from tests.helpers import tiny_document


def test_a_package_runs_its_main_module_and_a_module_itself() -> None:
    assert warm_torchrun.rank_module("pipebd_core.distill").__name__ == "pipebd_core.distill.__main__"
    assert warm_torchrun.rank_module("pipebd_core.distill.finalize").__name__ == "pipebd_core.distill.finalize"


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
