"""Elastic jobs: a run directory continued on another number of nodes (docs/multinode.md, "Elastic jobs").

A job with `schedule.elastic` that lost nodes goes on with the nodes it has: `reshape` rewrites the run
directory's spec.json for them (pinned stages keep their cuts: `ScheduleSpec.on_nodes`) and, while the
distillation has not ended, sets the plan phase to run again, so the ranks left are re-planned from the job's
profile (its block costs and link between nodes, pipebd_core/planning/distill_planner.py `planned_machines`).
Every block then continues from its checkpoints under the new plan: what is learned does not depend on the
plan, so the students are those of an uninterrupted run. Likewise, while the end-to-end training has not ended,
the plan_finetune phase runs again: its strategy and cut are planned for the ranks left and the finetune
checkpoints re-cut for them (pipebd_core/finetune/recut.py). events.jsonl records `reshaped {from_nodes, nodes,
nproc}`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipebd_core.documents.phases import DISTILL, FINETUNE, PLAN, PLAN_FINETUNE
from pipebd_core.rundir import RunDir


@dataclass(frozen=True)
class Reshaped:
    """A run directory moved from `was_nodes` to `nodes` nodes of `nproc` ranks each."""

    was_nodes: int
    nodes: int
    nproc: int
    replanned: bool  # the plan phase runs again (the distillation had not ended)


def reshape(run_dir: RunDir, nodes: int) -> Reshaped | None:
    """Continue `run_dir` on `nodes` nodes; None when it already runs on that many."""
    spec = run_dir.load_spec()
    was = spec.schedule.nodes
    if was == nodes:
        return None
    schedule = spec.schedule.on_nodes(nodes)
    run_dir.write_json(run_dir.spec, spec.model_copy(update={"schedule": schedule}).model_dump(mode="json"))
    records = run_dir.load_phases()
    distilled = any(record.name == DISTILL and record.done for record in records)
    trained = any(record.name == FINETUNE and record.done for record in records)
    for record in records:
        if (record.name == PLAN and not distilled) or (record.name == PLAN_FINETUNE and not trained):
            record.reset()  # planned again for the ranks it has (a finetune's checkpoints re-cut: finetune/recut.py)
    run_dir.save_phases(records)
    run_dir.append_event("reshaped", from_nodes=was, nodes=nodes, nproc=schedule.nproc)
    return Reshaped(was, nodes, schedule.nproc, replanned=not distilled)
