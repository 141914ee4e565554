"""Prepare a run directory, and start what each phase runs.

`prepare_run` does every check that can fail before a process starts (spec, devices, data set,
workload, a plan without a profile), so a bad job never leaves half a run behind it; it writes
spec.json and phases.json. The supervisor (supervisor.py) then runs the phases; this module says how
to start each: `skip_reason` (a cached profile), `run_local` (the plan phases; a worker's in a child
process), `start_phase` (the torchrun or single process of the others, in a session of its own so the
whole tree can be signalled at once) and `complete` (a measured profile goes into the cache).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import IO

from pipebd_core import devices
from pipebd_core.documents.phases import PLAN, PLAN_FINETUNE, PROFILE, PROFILE_FINETUNE
from pipebd_core.documents.step import StepName
from pipebd_core.job import agent_server, forked, isolated
from pipebd_core.job.forked import PhaseProcess
from pipebd_core.job.phases import PHASE_KINDS, job_phases, new_records
from pipebd_core.job.processes import Rendezvous, rank_environment, torchrun_command
from pipebd_core.planning import profiles
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.builders import warm_modules

PROFILE_TRIALS = 5  # timed trials per profiled measurement


def default_run_dir(spec: Spec, base: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return base / f"{spec.name}-{stamp}"


def check_devices(spec: Spec) -> None:
    """The devices this node has for the ranks, checked before any process starts (without importing torch
    where there are no GPUs: pipebd_core/devices.py)."""
    schedule = spec.schedule
    if schedule.device == "cpu":
        return
    if not devices.cuda_available():
        if schedule.device == "cuda":
            raise SpecError("schedule.device: 'cuda' but CUDA is not available on this machine; use 'auto' or 'cpu'")
        return
    gpus = devices.cuda_count()
    if schedule.nproc > gpus:
        raise SpecError(
            f"schedule.nproc: {schedule.nproc} ranks need one GPU each but this machine has {gpus};"
            f" use --nproc {gpus} or fewer, or schedule.device: cpu"
        )


def prepare_run(spec: Spec, out: Path | None = None, phases: list[str] | None = None, isolate: bool = False) -> RunDir:
    """Validate everything, then create the run directory with spec.json and phases.json (the job's
    phases, or just `phases`: the finetune benchmark runs only the end-to-end training's). `isolate`: the
    preflight, which builds the workload and the data set (job/steps.py), runs in a child process
    (isolated.py), as a long-lived worker needs; a one-shot command runs it here."""
    check_devices(spec)
    isolated.run_step("preflight", spec, None, isolate)
    root = out if out is not None else default_run_dir(spec)
    run_dir = RunDir(root)
    if run_dir.spec.exists():
        raise SpecError(f"--out {root}: a run already lives there; use --resume {root} or another folder")
    root.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(run_dir.spec, spec.model_dump(mode="json"))
    run_dir.save_phases(new_records(run_dir, phases or job_phases(spec)))
    run_dir.append_event("prepared", mode=spec.schedule.mode, nproc=spec.schedule.nproc)
    return run_dir


def architecture_of(run_dir: RunDir) -> str | None:
    """A searched network's architecture as written (part of its layer profile's cache key)."""
    return run_dir.architecture.read_text() if run_dir.architecture.exists() else None


def skip_reason(run_dir: RunDir, spec: Spec, phase: str, refresh: bool = False) -> str | None:
    """Why `phase` need not run: a profile phase finds its cached profile (copied into the run directory)."""
    if phase not in (PROFILE, PROFILE_FINETUNE) or refresh:
        return None
    layers = phase == PROFILE_FINETUNE
    architecture = architecture_of(run_dir) if layers else None
    cached = profiles.load_cached_layers(spec, architecture) if layers else profiles.load_cached(spec)
    if cached is None:
        return None
    run_dir.write_json(run_dir.layer_profile if layers else run_dir.profile, cached.to_json())
    return profiles.describe_cached(cached, profiles.cache_path(spec, architecture, layers))


def run_local(run_dir: RunDir, spec: Spec, phase: str, isolate: bool = False) -> None:
    """The phases the supervisor runs without ranks (job/steps.py): `plan` writes plan.json, `plan_finetune`
    finetune_plan.json. `isolate`: in a child process (isolated.py), as a long-lived worker needs."""
    assert phase in (PLAN, PLAN_FINETUNE), f"phase {phase!r} does not run locally"
    step: StepName = "plan" if phase == PLAN else "plan_finetune"
    isolated.run_step(step, spec, run_dir, isolate)


def phase_command(
    run_dir: RunDir, spec: Spec, phase: str, trials: int = PROFILE_TRIALS, rendezvous: Rendezvous | None = None
) -> list[str]:
    kind = PHASE_KINDS[phase]
    assert kind.module is not None, f"phase {phase!r} runs no process"
    extra = ["--trials", str(trials)] if phase in (PROFILE, PROFILE_FINETUNE) else []
    if kind.runs == "torchrun":
        return torchrun_command(spec.schedule.nproc, run_dir, kind.module, *extra, rendezvous=rendezvous)
    return [sys.executable, "-m", kind.module, "--run-dir", str(run_dir.root.resolve()), *extra]


def start_phase(
    run_dir: RunDir,
    spec: Spec,
    phase: str,
    extra_env: dict[str, str] | None = None,
    trials: int = PROFILE_TRIALS,
    rendezvous: Rendezvous | None = None,
) -> PhaseProcess:
    """Start the phase's processes in a session of their own, their output on its launcher log (this node's,
    in a launch on several nodes: `rendezvous`). Warm where it can: a torchrun agent is forked by this
    process's agent server (agent_server.py), and so is a single-process phase (finalize, evaluate), the
    server having imported the job's workload (torchvision, transformers) once for every later phase; where
    there is no server, a single-process phase is forked from this process (forked.py)."""
    node = rendezvous.node if rendezvous is not None else 0
    if node == 0:
        run_dir.clear_errors(phase)  # the errors of an earlier attempt are not this one's
    log_path = run_dir.launcher_log(phase, node)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = phase_command(run_dir, spec, phase, trials, rendezvous)
    env = rank_environment(spec, extra_env)
    with log_path.open("ab") as log:
        process = warm_start(command, env, log, warm_modules(spec), single=PHASE_KINDS[phase].runs == "process")
        if process is None:  # a fresh interpreter
            process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole, never half
            )
    run_dir.append_event("launched", phase=phase, pid=process.pid, **({"node": node} if rendezvous else {}))
    return process


def warm_start(
    command: list[str], env: dict[str, str], log: IO[bytes], modules: list[str], single: bool
) -> PhaseProcess | None:
    """The phase's process started warm (see `start_phase`), or None: start it as a fresh interpreter."""
    process: PhaseProcess | None = agent_server.start(command, env, log, modules)
    if process is None and single:  # no server here (PIPEBD_FRESH_AGENTS, or gone): fork this process
        process = forked.start(command, env, log)
    return process


def complete(run_dir: RunDir, spec: Spec, phase: str) -> None:
    """After a phase succeeded: a measured profile goes into the cache."""
    if phase not in (PROFILE, PROFILE_FINETUNE):
        return
    layers = phase == PROFILE_FINETUNE
    path = run_dir.layer_profile if layers else run_dir.profile
    if not path.exists():
        raise profiles.ProfileError(f"the {phase} phase ended without writing {path}")
    if layers:
        profiles.store(spec, run_dir.load_layer_profile(), architecture_of(run_dir))
    else:
        profiles.store(spec, run_dir.load_profile())


def temporary_run(spec: Spec, phases: list[str]) -> RunDir:
    """A throw-away run directory for a job of just `phases` (`pipebd profile`, `pipebd plan`)."""
    run_dir = RunDir(Path(tempfile.mkdtemp(prefix="pipebd-")))
    run_dir.write_json(run_dir.spec, spec.model_dump(mode="json"))
    run_dir.save_phases(new_records(run_dir, phases))
    return run_dir


def remove(run_dir: RunDir) -> None:
    shutil.rmtree(run_dir.root, ignore_errors=True)
