"""A job is a sequence of phases: what each one runs, what it writes, and the record of how it went.

    profile    torchrun of pipebd_core.planning.profiler: every block measured on the job's ranks;
               skipped when a cached profile fits (the cached one is copied to profile.json)
    plan       a local step: resolve the plan from the profile (or FLOP estimates) into plan.json
    distill    torchrun of pipebd_core: the ranks train every student block (checkpoints, telemetry)
    finalize   one process: gather the students, assemble, evaluate, write the artifacts
    profile_finetune  torchrun of pipebd_core.planning.layer_profiler: every layer's F, B, I, W measured;
               skipped when a cached layer profile fits
    plan_finetune  a local step: the end-to-end training's strategy, stage cuts and actions per rank
    finetune   torchrun of pipebd_core.training: the whole network trained on labelled data
    evaluate   one process: top-1 before and after, the trained network saved and exported

`phases.json` holds one `PhaseRecord` per phase, in order, updated as the supervisor (supervisor.py)
moves through them; a resumed job runs the phases that have not yet succeeded.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pipebd_core.outcomes import CANCELLED, FAILED, SKIPPED, SUCCEEDED
from pipebd_core.rundir import DISTILL, RunDir
from pipebd_core.spec import Spec

PROFILE, PLAN, FINALIZE = "profile", "plan", "finalize"
PROFILE_FINETUNE, PLAN_FINETUNE, FINETUNE, EVALUATE = "profile_finetune", "plan_finetune", "finetune", "evaluate"
Runs = Literal["torchrun", "process", "local"]
PENDING, RUNNING, ENDED = "pending", "running", "ended"
OUTCOMES = (SUCCEEDED, FAILED, CANCELLED, SKIPPED)


@dataclass(frozen=True)
class PhaseKind:
    name: str
    runs: Runs  # torchrun: one process per rank; process: one process; local: in the supervising process
    module: str | None  # the module its processes run (`python -m`)
    outputs: tuple[str, ...]  # what it writes, relative to the run directory
    weight: float  # its share of a job's progress bar, relative to the others
    description: str


PHASE_KINDS: dict[str, PhaseKind] = {
    PROFILE: PhaseKind(
        PROFILE,
        "torchrun",
        "pipebd_core.planning.profiler",
        ("profile.json", "logs/profile/", "errors/profile/"),
        0.1,
        "measure every block on the job's ranks (skipped when a cached profile fits)",
    ),
    PLAN: PhaseKind(PLAN, "local", None, ("plan.json",), 0.0, "resolve the plan from the profile"),
    DISTILL: PhaseKind(
        DISTILL,
        "torchrun",
        "pipebd_core",
        ("checkpoints/", "metrics/distill/", "logs/distill/", "errors/distill/"),
        1.0,
        "train every student block against its teacher block",
    ),
    FINALIZE: PhaseKind(
        FINALIZE,
        "process",
        "pipebd_core.finalize",
        ("student.pt", "compressed_model.pt", "architecture.json", "searched_model.pt", "summary.json"),
        0.05,
        "gather the students, assemble and evaluate the result",
    ),
    PROFILE_FINETUNE: PhaseKind(
        PROFILE_FINETUNE,
        "torchrun",
        "pipebd_core.planning.layer_profiler",
        ("layer_profile.json", "logs/profile_finetune/", "errors/profile_finetune/"),
        0.1,
        "measure every layer of the network to train (skipped when a cached layer profile fits)",
    ),
    PLAN_FINETUNE: PhaseKind(
        PLAN_FINETUNE, "local", None, ("finetune_plan.json",), 0.0, "plan the end-to-end training"
    ),
    FINETUNE: PhaseKind(
        FINETUNE,
        "torchrun",
        "pipebd_core.training",
        ("checkpoints/finetune/", "metrics/finetune/", "logs/finetune/", "errors/finetune/"),
        1.0,
        "train the whole network end to end on labelled data",
    ),
    EVALUATE: PhaseKind(
        EVALUATE,
        "process",
        "pipebd_core.training.evaluate",
        ("finetuned_model.pt", "finetuned_model.pt2", "teacher.pt", "summary.json"),
        0.05,
        "measure top-1 before and after, save and export the trained network",
    ),
}


def job_phases(spec: Spec) -> list[str]:
    """The phases a spec's job runs, in order: distillation's unless it trains a network (kind train), then
    end-to-end training's when the spec has a finetune section."""
    distill = (
        []
        if spec.workload.kind == "train"
        else [*([PROFILE] if spec.schedule.profile else []), PLAN, DISTILL, FINALIZE]
    )
    tune = spec.finetune
    finetune = [*([PROFILE_FINETUNE] if tune.profile else []), PLAN_FINETUNE, FINETUNE, EVALUATE] if tune else []
    return [*distill, *finetune]


@dataclass
class PhaseRecord:
    """One phase of one job: where it stands and, once ended, how it ended."""

    name: str
    runs: str
    state: str = PENDING  # pending | running | ended
    outcome: str | None = None  # once ended: succeeded | failed | cancelled | skipped
    reason: str | None = None  # a termination reason (outcomes.py), or why it was skipped
    started_at: float | None = None
    ended_at: float | None = None
    outputs: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Nothing more to do for it: it succeeded or was skipped."""
        return self.outcome in (SUCCEEDED, SKIPPED)

    def start(self) -> None:
        self.state, self.outcome, self.reason = RUNNING, None, None
        self.started_at, self.ended_at = time.time(), None

    def end(self, outcome: str, reason: str | None = None) -> None:
        assert outcome in OUTCOMES, f"unknown phase outcome {outcome!r}"
        stamp = time.time()
        self.state, self.outcome, self.reason = ENDED, outcome, reason
        self.started_at = self.started_at or stamp
        self.ended_at = stamp

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, name: str) -> PhaseRecord:
        kind = PHASE_KINDS[name]
        return cls(name=name, runs=kind.runs, outputs=list(kind.outputs))


def new_records(spec: Spec) -> list[PhaseRecord]:
    return [PhaseRecord.of(name) for name in job_phases(spec)]


def read_records(run_dir: RunDir) -> list[PhaseRecord]:
    return [PhaseRecord(**entry) for entry in run_dir.read_json(run_dir.phases)]


def write_records(run_dir: RunDir, records: list[PhaseRecord]) -> None:
    run_dir.write_json(run_dir.phases, [record.to_json() for record in records])


def current(records: list[PhaseRecord]) -> PhaseRecord | None:
    """The phase running now, else the next one to run, else None (every phase is done)."""
    running = [record for record in records if record.state == RUNNING]
    if running:
        return running[0]
    return next((record for record in records if not record.done), None)


def job_fraction(records: list[PhaseRecord], running_fraction: float) -> float:
    """The whole job's progress: the phases that are done, plus `running_fraction` of the running one,
    each weighted by its kind's share (PhaseKind.weight) among the phases that run (skipped ones don't)."""
    counted = [record for record in records if record.outcome != SKIPPED]
    total = sum(PHASE_KINDS[record.name].weight for record in counted)
    if total == 0:
        return 1.0 if all(record.done for record in records) else 0.0
    done = 0.0
    for record in counted:
        weight = PHASE_KINDS[record.name].weight
        if record.done:
            done += weight
        elif record.state == RUNNING:
            done += weight * min(1.0, max(0.0, running_fraction))
    return done / total
