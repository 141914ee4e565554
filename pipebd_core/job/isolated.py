"""Run a launch step that builds a network or loads a data set (job/steps.py: the preflight, the `plan` phase,
the `plan_finetune` phase, a distill phase's re-plan) in a child process, so that the process that supervises
jobs (a Celery worker) imports none of torch, torchvision or transformers and never holds a network's memory.

The child is `python -m pipebd_core.job.steps --folder FOLDER`, forked by this process's agent server
(agent_server.py), which imported torch once and imports the job's workload and data set modules once
(`workloads.builders.warm_modules`) for every later step and phase: a step starts in milliseconds, where a
fresh interpreter would spend 3-4 s of CPU importing torch first. Where there is no server
(PIPEBD_FRESH_AGENTS, or it is gone) the child is a fresh interpreter. The request (StepRequest) and the
answer (StepAnswer) are JSON files in a temporary folder, the child's output in a log beside them.

A step's SpecError, PlanError, ProfileError or DocumentError is raised here as the same type with the same
message (what the launch's callers handle); any other error, or a child that ends without an answer
(killed, out of memory), raises StepFailed saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.step import StepAnswer, StepName, StepRequest
from pipebd_core.job import agent_server
from pipebd_core.job.forked import PhaseProcess
from pipebd_core.planning.profiles import ProfileError
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.builders import warm_modules

STEPS_MODULE = "pipebd_core.job.steps"
REQUEST, ANSWER, LOG = "request.json", "answer.json", "step.log"
RAISED_AS_THEMSELVES: dict[str, type[Exception]] = {
    error.__name__: error for error in (SpecError, PlanError, ProfileError, DocumentError)
}
LOG_TAIL_CHARS = 2000  # of a child that ended without an answer: what it printed last


class StepFailed(RuntimeError):
    """The child running a step ended without an answer, or raised an error not raised here as itself."""


def run_step(step: StepName, spec: Spec, run_dir: RunDir | None = None, isolate: bool = True) -> dict[str, Any] | None:
    """Run `step` in a child process and wait for it; raise what it raised (see the module's docstring), or
    return what it gave back. `isolate=False`: here, as a one-shot command (`pipebd run`) may."""
    if not isolate:
        from pipebd_core.job import steps  # torch and the planners: only in a process that builds networks

        return steps.run(step, spec, run_dir)
    folder = Path(tempfile.mkdtemp(prefix=f"pipebd-{step}-"))
    try:
        request = StepRequest(
            step=step,
            spec=spec.model_dump(mode="json"),
            run_dir=None if run_dir is None else str(run_dir.root.resolve()),
        )
        (folder / REQUEST).write_text(json.dumps(request.to_json()))
        code = start_child(folder, spec).wait()
        if not (folder / ANSWER).exists():
            tail = (folder / LOG).read_text(errors="replace")[-LOG_TAIL_CHARS:].strip()
            raise StepFailed(
                f"the {step} step ended with exit code {code} and no answer" + (f": {tail}" if tail else "")
            )
        answer = StepAnswer.from_json(json.loads((folder / ANSWER).read_text()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if answer.error in RAISED_AS_THEMSELVES:
        raise RAISED_AS_THEMSELVES[answer.error](answer.message)
    if answer.error is not None:
        raise StepFailed(f"the {step} step failed: {answer.error}: {answer.message}")
    return answer.result


def start_child(folder: Path, spec: Spec) -> PhaseProcess:
    """`python -m pipebd_core.job.steps --folder FOLDER`, forked by the agent server, or a fresh interpreter."""
    command = [sys.executable, "-m", STEPS_MODULE, "--folder", str(folder)]
    env = dict(os.environ)
    with (folder / LOG).open("ab") as log:
        process: PhaseProcess | None = agent_server.start(command, env, log, warm_modules(spec))
        if process is None:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process
