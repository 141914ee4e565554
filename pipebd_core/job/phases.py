"""A job is a sequence of phases: what each one runs, what it writes, and the record of how it went.

    profile    torchrun of pipebd_core.profile.blocks: every block measured on the job's ranks;
               skipped when a cached profile fits (the cached one is copied to profile.json)
    plan       a local step (a forked child of the supervisor): resolve the plan from the profile (or FLOP
               estimates) into plan.json
    distill    torchrun of pipebd_core: the ranks train every student block (checkpoints, telemetry)
    finalize   one process: gather the students, assemble, evaluate, write the artifacts
    profile_finetune  torchrun of pipebd_core.profile.layers: every layer's F, B, I, W measured;
               skipped when a cached layer profile fits
    plan_finetune  a local step (a forked child): the end-to-end training's strategy, stage cuts and actions per rank
    finetune   torchrun of pipebd_core.finetune: the whole network trained on labelled data
    evaluate   one process: top-1 before and after, the trained network saved and exported

`phases.json` holds one `PhaseRecord` per phase (pipebd_core/documents/phases.py, which names the phases),
in order, updated as the supervisor (supervisor.py) moves through them; a resumed job runs the phases
that have not yet succeeded. What each phase writes is the run directory's to say (`RunDir.phase_outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipebd_core.documents.phases import (
    DISTILL,
    EVALUATE,
    FINALIZE,
    FINETUNE,
    PLAN,
    PLAN_FINETUNE,
    PROFILE,
    PROFILE_FINETUNE,
    RUNNING,
    SKIPPED,
    PhaseRecord,
    Runs,
)
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec


@dataclass(frozen=True)
class PhaseKind:
    name: str
    runs: Runs  # torchrun: a process per rank; process: one process; local: a forked child (job/isolated.py)
    module: str | None  # the module its processes run (`python -m`)
    weight: float  # its share of a job's progress bar, relative to the others
    description: str


PHASE_KINDS: dict[str, PhaseKind] = {
    PROFILE: PhaseKind(
        PROFILE,
        "torchrun",
        "pipebd_core.profile.blocks",
        0.1,
        "measure every block on the job's ranks (skipped when a cached profile fits)",
    ),
    PLAN: PhaseKind(PLAN, "local", None, 0.0, "resolve the plan from the profile"),
    DISTILL: PhaseKind(
        DISTILL,
        "torchrun",
        "pipebd_core.distill",
        1.0,
        "train every student block against its teacher block",
    ),
    FINALIZE: PhaseKind(
        FINALIZE,
        "process",
        "pipebd_core.distill.finalize",
        0.05,
        "gather the students, assemble and evaluate the result",
    ),
    PROFILE_FINETUNE: PhaseKind(
        PROFILE_FINETUNE,
        "torchrun",
        "pipebd_core.profile.layers",
        0.1,
        "measure every layer of the network to train (skipped when a cached layer profile fits)",
    ),
    PLAN_FINETUNE: PhaseKind(PLAN_FINETUNE, "local", None, 0.0, "plan the end-to-end training"),
    FINETUNE: PhaseKind(
        FINETUNE,
        "torchrun",
        "pipebd_core.finetune",
        1.0,
        "train the whole network end to end on labelled data",
    ),
    EVALUATE: PhaseKind(
        EVALUATE,
        "process",
        "pipebd_core.finetune.evaluate",
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


def new_records(run_dir: RunDir, phases: list[str]) -> list[PhaseRecord]:
    """Pending records of `phases`, in order, each with what it will write."""
    return [PhaseRecord(name=name, runs=PHASE_KINDS[name].runs, outputs=run_dir.phase_outputs(name)) for name in phases]


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
