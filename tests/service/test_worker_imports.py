"""A worker's own process imports no torch: what it runs at start (the Celery app, its tasks, the launcher,
the supervisor, the launch) loads none of torch, torchvision or transformers; the steps that build networks
run in child processes (pipebd_core/job/isolated.py). Read from a fresh interpreter's `sys.modules`, so any
import, however indirect, that brings torch back fails here; the same probe on the steps' own module, which
does import torch, shows it can fail."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT

HEAVY = ("torch", "torchvision", "transformers")
WORKER_MODULES = ("app.cli.main", "worker.service", "worker.tasks", "pipebd_core.job.supervisor")


def heavy_imported_by(*modules: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has imported once it imported `modules`."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        f"print(json.dumps([name for name in {list(HEAVY)!r} if name in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout)
    return names


def test_a_worker_process_imports_no_torch_while_the_steps_it_runs_in_children_do() -> None:
    assert heavy_imported_by(*WORKER_MODULES) == []
    assert heavy_imported_by("pipebd_core.job.steps") == ["torch"]
