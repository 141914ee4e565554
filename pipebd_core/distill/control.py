"""Stopping a phase's ranks at a step boundary with every block checkpointed: how a job is re-planned
(and paused) without losing or changing what it learns.

The supervisor asks: `request_stop` writes control/stop.json. The ranks look at the start of every task
(a stat of the file, microseconds). Where they stop is decided once, by the plan's deciding rank, and
written to control/stop_at.json before anyone can need it:

    pipelined plans  the first rank of stage 0 decides at the start of its step s that every rank stops
                     before step P = s + 2. Every input of step s + 1, to any rank, is sent after that
                     moment (the other replicas of stage 0 begin s + 1 only after step s's all-reduce
                     with the decider; later stages send what they received), and a rank looks for P
                     once its input has come, before posting the next receive: nobody waits for a step
                     that will not be sent
    dp               every rank runs the same tasks in lockstep (an all-reduce each): rank 0, at the
                     start of task i, chooses the first step boundary K > i; the others cannot finish
                     task i before it chose
    ls               ranks never talk: each stops at its next step boundary

A rank that stops saves every block it owns at the step the block reached and exits 0; the supervisor
knows from `stop_requested` that the phase stopped rather than ended. The blocks then resume from
those checkpoints (a pipelined plan from the common step P), under any plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipebd_core.distill.plan import Plan
from pipebd_core.distill.schedule import Task
from pipebd_core.documents.control import StopAt
from pipebd_core.rundir import RunDir

PAUSE = "pause"  # the reason of a stop that pauses the job (the service's pause, a worker shutting down)


def request_stop(run_dir: RunDir, reason: str) -> None:
    """Ask the running phase's ranks to stop at their next step boundary."""
    run_dir.write_json(run_dir.stop_request, {"reason": reason})


def stop_requested(run_dir: RunDir) -> str | None:
    """The reason a stop was asked for, or None."""
    path = run_dir.stop_request
    return str(json.loads(path.read_text())["reason"]) if path.exists() else None


def clear_stop(run_dir: RunDir) -> None:
    """Forget a stop that was carried out (before the phase runs again)."""
    for path in (run_dir.stop_request, run_dir.stop_at):
        path.unlink(missing_ok=True)
    for marker in run_dir.stopped.glob("rank-*"):
        marker.unlink()


@dataclass
class StopWatch:
    """A rank's view of a stop request: `before(index, step)` says whether to stop before its task `index`."""

    run_dir: RunDir
    plan: Plan
    rank: int
    tasks: list[Task]  # this rank's task list (dp ranks all have the same one)
    limit: StopAt | None = None  # once decided

    @property
    def decides(self) -> bool:
        if self.plan.mode == "ls":
            return True
        if self.plan.is_pipeline:
            return self.plan.stages[0].ranks[0] == self.rank
        return self.rank == 0

    def before(self, index: int, step: int) -> bool:
        """Whether to stop before the task at position `index` of this rank's list, of global step `step`
        (asked at each task's start, and before posting the receive of the next task)."""
        limit = self._limit(index, step)
        if limit is None:
            return False
        return limit.reached(index, step)

    def _limit(self, index: int, step: int) -> StopAt | None:
        if self.limit is not None:
            return self.limit
        decided = self.run_dir.stop_at
        if decided.exists():
            self.limit = StopAt.from_json(json.loads(decided.read_text()))
        elif self.decides and self.run_dir.stop_request.exists():
            self.limit = self._decide(index, step)
        return self.limit

    def _decide(self, index: int, step: int) -> StopAt:
        """Where everyone stops, fixed by the deciding rank at the start of its task `index`: the next
        step boundary (a NAS step's architecture round stays with its weight round)."""
        if self.plan.is_pipeline:
            limit = StopAt(step=step + 2)
        else:
            first = index if self.plan.mode == "ls" else index + 1  # ls: alone, so it may stop now
            ends = (j for j in range(first, len(self.tasks)) if j == 0 or self.tasks[j - 1].last_of_step)
            boundary = next(ends, len(self.tasks))
            limit = StopAt(task=boundary)
        if self.plan.mode != "ls":  # ls ranks never share a decision
            self.run_dir.write_json(self.run_dir.stop_at, limit.to_json())
        return limit


def stop_step(run_dir: RunDir) -> int | None:
    """The step a pipelined plan's ranks stopped before (every block checkpointed there), once decided."""
    path = run_dir.stop_at
    return StopAt.from_json(json.loads(path.read_text())).step if path.exists() else None


def stopped_early(run_dir: RunDir) -> bool:
    """Whether the ranks that just exited stopped before the end (they may have finished first)."""
    return run_dir.stopped.exists() and any(run_dir.stopped.iterdir())


def mark_stopped(run_dir: RunDir, rank: int) -> None:
    """Record that `rank` stopped before its last task (what `stopped_early` reads)."""
    marker = run_dir.stopped_marker(rank)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
