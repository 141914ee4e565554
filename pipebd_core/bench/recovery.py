"""The recovery benchmark's record (benchmarks/recovery.py) and its table on the benchmarks page.

Each run is a 2-node x 1-rank elastic job (`min_nodes: 1`) of the service that loses its second node
mid-distillation, for good: its worker SIGKILLed (`kill`: node 0 hears the seat fall silent) or sent SIGTERM
(`preempt`: a preemption notice, every node's ranks stop at their next step boundary). The job goes on with the
first node alone, re-planned. A run records, from that moment (`notice_at`): when the attempt ended (node 0
stopped the job), when the next attempt trained its first step, and the steps lost: those the ranks had trained
(the last step any rank wrote) that the next attempt trains again (it resumes every block from its
checkpoint). After a kill that is at most the checkpoint interval; after a notice, none.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.parts import Part

Event = Literal["kill", "preempt"]


class RecoveryRun(Part):
    """One job that lost its second node, and how it went on."""

    event: Event
    stopped_s: float  # from the notice (the kill, the SIGTERM) to the end of the attempt
    training_s: float  # from the notice to the next attempt's first step, on the node left
    last_step: int  # the last step a rank trained before the attempt ended
    resumed_from: int  # the step the next attempt resumed every block from (the smallest)
    outcome: str  # how the attempt ended: requeued (node_lost) or preempted
    nodes_after: int  # the nodes the next attempt ran on

    @property
    def steps_lost(self) -> int:
        """Steps trained before that the next attempt trains again."""
        return max(0, self.last_step + 1 - self.resumed_from)


class RecoveryRecord(Part):
    """benchmarks/recovery.py's result file."""

    benchmark: Literal["recovery"] = "recovery"
    commit: str | None
    machine: Machine
    checkpoint_every: int  # steps between periodic checkpoints
    total_steps: int
    stale_after_s: float  # node 0 stops the job when another node's seat is silent this long
    gang_bound_s: float  # a gang still short of seats this long runs with those it has (>= min_nodes)
    preempt_grace_s: float
    runs: list[RecoveryRun]
    # CPU the runs caused outside the bench's process tree, counted as its own in `load`: the PostgreSQL backends
    # of its database and the ranks a killed worker left behind (no longer anyone's children)
    outside_tree_cpu_s: float
    load: Load  # the node while every run ran


def _summary(runs: list[RecoveryRun], event: Event) -> str:
    chosen = [run for run in runs if run.event == event]
    stopped = statistics.median(run.stopped_s for run in chosen)
    training = [run.training_s for run in chosen]
    lost = [run.steps_lost for run in chosen]
    return (
        f"| {event} | {len(chosen)} | {stopped:.1f} s | {statistics.median(training):.1f} s"
        f" ({min(training):.1f}-{max(training):.1f}) | {max(lost)} ({', '.join(map(str, lost))}) |"
    )


def render_recovery(record: RecoveryRecord) -> str:
    """The record's table: per kind of loss, the median time to the attempt's end and to training again on the
    node left, and the steps lost (the most, then each run's)."""
    shared = "shared" if record.load.shared else "quiet"
    lines = [
        f"Commit `{record.commit}`; {record.total_steps} steps, checkpointed every {record.checkpoint_every};"
        f" seat silent after {record.stale_after_s:g} s, gang bound {record.gang_bound_s:g} s, preemption grace"
        f" {record.preempt_grace_s:g} s; other processes used {record.load.other_cores:.3f} cores ({shared}).",
        "",
        "| node lost by | runs | to the attempt's end (median) | to training again (median, range) |"
        " steps lost (most, each run) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        _summary(record.runs, event) for event in ("kill", "preempt") if any(r.event == event for r in record.runs)
    ]
    return "\n".join(lines) + "\n"
