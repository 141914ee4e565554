"""Calibration: the block times training measured, next to what the profile said, as ratios the cost
model applies.

Every distillation task's telemetry line carries `block_s`: each teacher block's forward and each
student block's step (forward, backward, update), timed as the profiler times them. A `Window` holds
the lines of one launch of the distill phase; leaving out each rank's first SKIP_STEPS steps (warm-up),
it is ready once every rank has MIN_STEPS more. `calibrate` turns it into, per block, the ratio of the
time measured to the time profiled over all its lines (each line against the profile at that line's
batch; sums, not a median of ratios: a step takes the mean, outliers included) for the teacher and the
student, the same for data loading, and for the gradient all-reduces one ratio (the all-reduce a rank
waits for after its backward, against the profile's all-reduces of the task's blocks: on a shared CPU
the all-reduce competes with the compute it overlaps); sends are not calibrated (what a receiving
rank measures is mostly waiting for the stage before it). What a task costs beyond all that (sends
posted, Python between tasks, telemetry, checkpoints) is measured too: `task_overhead_s`, the mean
time between a rank's lines not spent in the blocks, loading, all-reduce or waiting for input; the
cost model adds it to every task. The result, a `Calibration` (pipebd_core/documents/calibration.py),
keeps both numbers and where they came from.

The supervisor writes it to the run's calibration.json and into the cached profile (`Profile.calibration`,
next to the measured numbers, which stay as they were): the next job of the same workload plans on
what training measured. `pipebd profile --refresh` measures afresh, without it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from pipebd_core.documents.calibration import BlockCalibration, Calibration, CalibrationSource
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.profile import Profile
from pipebd_core.documents.telemetry import DistillLine, FileTail, read_line
from pipebd_core.planning.distill_costmodel import at_batch, profiled_allreduce, profiled_student
from pipebd_core.rundir import RunDir

SKIP_STEPS = 2  # each rank's first steps after a launch: allocations, first touches, the pipeline filling
MIN_STEPS = 4  # steps per rank a window needs, after the skipped ones


@dataclass
class Window:
    """The distill phase's telemetry lines since one launch, read as they are appended."""

    run_dir: RunDir
    nproc: int
    tails: list[FileTail] = field(default_factory=list)
    lines: dict[int, list[DistillLine]] = field(default_factory=dict)  # per rank, in order

    @classmethod
    def opened(cls, run_dir: RunDir, nproc: int) -> Window:
        """A window that starts now: lines already in the files belong to earlier launches."""
        tails = []
        for rank in range(nproc):
            path = run_dir.metrics(rank)
            tails.append(FileTail(path, path.stat().st_size if path.exists() else 0))
        return cls(run_dir, nproc, tails, {rank: [] for rank in range(nproc)})

    def read(self) -> None:
        for rank, tail in enumerate(self.tails):
            for text in tail.read_new():
                line = read_line(DISTILL, text)
                assert isinstance(line, DistillLine), "the distill phase writes distillation lines"
                self.lines[rank].append(line)

    def steady(self, since_step: int | None = None) -> dict[int, list[DistillLine]]:
        """Each rank's lines past its first SKIP_STEPS steps (and from `since_step` on, when given)."""
        result = {}
        for rank, lines in self.lines.items():
            kept = lines[SKIP_STEPS:]
            result[rank] = [line for line in kept if since_step is None or line.step >= since_step]
        return result

    def ready(self, since_step: int | None = None) -> bool:
        return all(len(records) >= MIN_STEPS for records in self.steady(since_step).values())

    def latest_step(self) -> int:
        return max((lines[-1].step for lines in self.lines.values() if lines), default=-1)


def measured_step_s(steady: dict[int, list[DistillLine]]) -> float | None:
    """A pipelined plan's step time: each rank's seconds per step over its steady lines, the slowest rank's
    (every rank of a pipeline runs at the pace of the slowest stage). None with fewer than 2 lines a rank."""
    paces = []
    for lines in steady.values():
        if len(lines) < 2:
            return None
        first, last = lines[0], lines[-1]
        paces.append((last.time - first.time) / max(1, last.step - first.step))
    return max(paces) if paces else None


def group_sizes(plan: PlanDocument) -> dict[int, int]:
    """Per rank of plan.json: how many ranks its gradients are all-reduced over (1: none)."""
    if plan.mode == "dp":
        return dict.fromkeys(range(plan.nproc), plan.nproc)
    sizes = dict.fromkeys(range(plan.nproc), 1)
    for stage in plan.stages:
        sizes.update(dict.fromkeys(stage.ranks, stage.replicas))
    return sizes


@dataclass
class Tally:
    """Seconds measured and seconds profiled for the same work, summed over lines."""

    measured: float = 0.0
    profiled: float = 0.0
    lines: int = 0

    def add(self, measured: float, profiled: float) -> None:
        if profiled > 0:
            self.measured += measured
            self.profiled += profiled
            self.lines += 1

    @property
    def ratio(self) -> float | None:
        return self.measured / self.profiled if self.lines else None

    @property
    def mean(self) -> float | None:
        """Seconds measured per line."""
        return self.measured / self.lines if self.lines else None


def calibrate(
    profile: Profile, steady: dict[int, list[DistillLine]], groups: dict[int, int], source: dict[str, Any]
) -> Calibration:
    """Per block: measured / profiled for the teacher and the student; data loading and the all-reduces
    (`groups`: each rank's group size, see `group_sizes`) likewise. A block this window did not see keeps
    the calibration it had."""
    blocks = profile.blocks
    tallies: dict[tuple[int, str], Tally] = {}
    batches: dict[int, int] = {}
    data, allreduce = Tally(), Tally()
    overhead = Tally()
    for lines in steady.values():
        for previous, line in itertools.pairwise(lines):
            overhead.add(max(0.0, line.time - previous.time - accounted_s(line)), 1.0)
    for rank, record in ((rank, r) for rank, lines in steady.items() for r in lines if r.round == "weights"):
        batch = record.samples
        for what, times in (("teacher", record.block_s.teacher), ("student", record.block_s.student)):
            for block, measured in times.items():
                profiled = (
                    at_batch(blocks[block].teacher_s, batch)
                    if what == "teacher"
                    else profiled_student(blocks[block], batch, groups[rank], profile.batch_size)
                )
                tallies.setdefault((block, what), Tally()).add(measured, profiled)
                batches[block] = batch
        loaded = record.phases.get("data", 0.0)
        data.add(loaded, at_batch(profile.data_s, batch) if loaded > 0 else 0.0)  # only ranks that load
        if groups[rank] > 1:  # as the cost model prices it, for a group the profile did not measure too
            profiled = sum(profiled_allreduce(blocks[b], groups[rank]) for b in record.blocks)
            if profiled > 0:  # none profiled (a profile of one rank): nothing to compare with
                allreduce.add(record.phases.get("allreduce", 0.0), profiled)
    before = profile.calibration
    calibrated = []
    for block in range(len(blocks)):
        entry = before.blocks[block].model_copy() if before else BlockCalibration()
        teacher, student = tallies.get((block, "teacher")), tallies.get((block, "student"))
        if teacher is not None and teacher.ratio is not None:
            entry.teacher, entry.teacher_s, entry.tasks = teacher.ratio, teacher.mean, teacher.lines
        if student is not None and student.ratio is not None:
            entry.student, entry.student_s, entry.tasks = student.ratio, student.mean, student.lines
        if block in batches:
            entry.batch = batches[block]
        calibrated.append(entry)
    return Calibration(
        blocks=calibrated,
        data=data.ratio or (before.data if before else 1.0),
        allreduce=allreduce.ratio or (before.allreduce if before else 1.0),
        task_overhead_s=overhead.ratio if overhead.ratio is not None else (before.task_overhead_s if before else 0.0),
        measured_step_s=measured_step_s(steady),
        source=CalibrationSource(**source, at=time.time()),
    )


def accounted_s(line: DistillLine) -> float:
    """What the cost model accounts for in a task (its blocks, loading, all-reduce) and the time it
    waited for its input; the rest of the time between two lines is the task's overhead."""
    blocks = sum(line.block_s.teacher.values()) + sum(line.block_s.student.values())
    phases = line.phases
    return blocks + phases.get("data", 0.0) + phases.get("allreduce", 0.0) + phases.get("recv_wait", 0.0)


def steps_covered(steady: dict[int, list[DistillLine]]) -> list[int]:
    """[first, last] step of the lines a calibration used."""
    steps = [line.step for lines in steady.values() for line in lines]
    return [min(steps), max(steps)] if steps else [0, 0]
