"""Benchmarks that survive being stopped: the record written after every run, and `pipebd bench --resume`.

A bench writes its record (bench.json) when it starts and again after every run it finishes, each time
whole (written beside and moved into place, so a kill never leaves half a file): the runs so far, and in
`runs_left` the runs still to run ("<arm>-<repeat>", in rotation order). The record is valid after every
run; the report renders a record with runs left as incomplete.

`pipebd bench --resume RECORD` continues such a bench where it stopped: the same spec, arms, steps and
repeats (all in the record), planned from the same frozen profile (frozen-profile.json beside the record,
checked against the record's hash), skipping every run the record holds and running the others in the
order the uninterrupted bench would have. The reference speed at the start stays the first start's; the
speed is measured again after every run (kept per run, so a run's error can be set beside the machine's speed
as it ran) and when the bench ends.

`--resume RECORD --again-shared` first takes out of the record every run measured while other
processes used more than its `shared_cores` (a shared figure is not a figure) and puts it back among the
runs left: the bench measures those runs again, each in its place in the rotation order. On a machine
shared with others, a bench whose runs are quiet can be had one run at a time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pipebd_core.bench.arms import BOUND, FROZEN_PROFILE, RECORD, freeze
from pipebd_core.bench.reference import reference_speed
from pipebd_core.documents.base import Document
from pipebd_core.documents.bench_record import SLOWEST_RANK, ArmRun, BenchRecord, KernelSpeed, Reference, RunSpeed

P = TypeVar("P", bound=Document)
Runs = dict[str, list[ArmRun]]


def write_record(out: Path, record: BenchRecord) -> Path:
    """out/bench.json, replaced whole."""
    path = out / RECORD
    partial = path.with_suffix(".json.partial")
    partial.write_text(record.model_dump_json(indent=1))
    os.replace(partial, path)
    return path


def read_record(path: Path, again_shared: bool = False) -> BenchRecord:
    """The record `--resume` continues (`again_shared`: without its shared runs, which it runs again); a
    ValueError naming the file when it is none or is complete (and quiet)."""
    try:
        record = BenchRecord.from_json(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise ValueError(f"--resume {path}: not a benchmark record (bench.json of `pipebd bench`): {error}") from None
    if again_shared:
        record = without_shared(record)
    if record.complete:
        quiet = ", and no run of it was measured shared" if again_shared else ""
        raise ValueError(f"--resume {path}: the bench is complete ({record.repeats} repeats of every arm){quiet}")
    if record.timing.pace != SLOWEST_RANK:
        raise ValueError(
            f"--resume {path}: its runs were timed by an earlier rule (each step's slowest rank), which the runs"
            " added now would not share; start a new bench with the same arguments"
        )
    return record


def without_shared(record: BenchRecord) -> BenchRecord:
    """`record` without the runs measured shared, each of them put back among the runs left."""
    shared = [f"{arm.name}-{run.repeat}" for arm in record.arms for run in arm.runs if run.load.shared]
    shared += [f"{BOUND}-{run.repeat}" for run in record.bound.runs if run.load.shared]
    arms = [arm.model_copy(update={"runs": [r for r in arm.runs if not r.load.shared]}) for arm in record.arms]
    bound = record.bound.model_copy(update={"runs": [r for r in record.bound.runs if not r.load.shared]})
    return record.model_copy(update={"arms": arms, "bound": bound, "runs_left": shared + record.runs_left})


def recorded_runs(record: BenchRecord) -> Runs:
    """The runs a record holds, by arm (the bound's under BOUND)."""
    return {**{arm.name: list(arm.runs) for arm in record.arms}, BOUND: list(record.bound.runs)}


@dataclass
class Progress(Generic[P]):
    """A bench under way: the profile every arm plans from, its hash, the reference speed at the start,
    the runs already done (those of the record it resumes)."""

    out: Path
    profile: P
    profile_hash: str
    start: KernelSpeed
    done: Runs
    after_runs: dict[str, KernelSpeed] = field(default_factory=dict)  # run name -> speed, in the order measured
    after_profile: KernelSpeed | None = None  # right after the profile was measured or read

    def reference(self, ended: bool) -> Reference:
        after = [RunSpeed(run=name, speed=speed) for name, speed in self.after_runs.items()]
        end = reference_speed() if ended else None
        return Reference(start=self.start, end=end, after_runs=after, after_profile=self.after_profile)

    def measure_after(self, runs: Runs) -> None:
        """The reference speed after each run in `runs` that has none yet (the one that just ended)."""
        for name in [f"{arm}-{run.repeat}" for arm, arm_runs in runs.items() for run in arm_runs]:
            if name not in self.after_runs:
                self.after_runs[name] = reference_speed()

    def writer(self, build: Callable[[Runs, Reference], BenchRecord]) -> Callable[[Runs, list[str]], None]:
        """What the rotation calls after every run: the record of the runs so far, `left` to run."""

        def written(runs: Runs, left: list[str]) -> None:
            self.measure_after(runs)
            record = build(runs, self.reference(ended=False))
            write_record(self.out, record.model_copy(update={"runs_left": left}))

        return written


def begin(out: Path, resume: BenchRecord | None, measure: Callable[[], P], kind: type[P]) -> Progress[P]:
    """A fresh bench (the reference speed, then the profile `measure` gives, frozen into `out`) or the
    bench `resume` left in `out` (its frozen profile, which must still have the record's hash)."""
    if resume is None:
        start = reference_speed()
        profile = measure()
        profiled = reference_speed()  # with `start`, the machine's speed around the profile
        return Progress(out, profile, freeze(profile, out), start, {}, after_profile=profiled)
    path = out / FROZEN_PROFILE
    try:
        profile = kind.from_json(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise RuntimeError(f"--resume: the frozen profile {path} cannot be read: {error}") from None
    if profile.digest() != resume.profile_hash:
        raise RuntimeError(
            f"--resume: {path} has hash {profile.digest()}, the record planned every arm from"
            f" {resume.profile_hash}; restore that profile or run the bench again"
        )
    start = resume.reference.start if resume.reference is not None else reference_speed()
    after_profile = resume.reference.after_profile if resume.reference is not None else None
    kept = speeds_kept(resume)
    return Progress(out, profile, resume.profile_hash, start, recorded_runs(resume), kept, after_profile)


def speeds_kept(record: BenchRecord) -> dict[str, KernelSpeed]:
    """The reference speeds after the runs `record` still holds (not those it runs again), by run name."""
    kept = {f"{arm}-{run.repeat}" for arm, runs in recorded_runs(record).items() for run in runs}
    measured = record.reference.after_runs if record.reference is not None else []
    return {speed.run: speed.speed for speed in measured if speed.run in kept}
