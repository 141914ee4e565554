"""The benchmark record (bench.json): what one `pipebd bench` measured, and under which conditions.

One document for both phases: distillation's modes, and end-to-end training's strategies or
partitioners (`compares`), each arm compared with the record's `baseline` arm (dp, ddp, pipedream).

Every figure of the benchmarks page is rendered from such records (pipebd_core/bench/report.py), never
typed by hand. A record holds the commit and the machine it ran on, the spec, the profile every arm
planned from (by its hash), the one timing rule every arm was measured by, and for every arm and
repeat: each timed global step, the predicted step, the hash of the profile that arm planned from,
and the load on the node while it ran (the cores other processes used). An arm run while other
processes used more than SHARED_CORES is `shared`: its figures are the machine's, not PipeBD's alone.
`bound` is the measured bound: one rank doing all the teacher and student work of a global step
(T1), divided by the ranks. A record of `pipebd bench --accuracy` (`compares: plans`) also holds
`accuracy`: every candidate plan's prediction next to what it measured, and the figures of how well
the planner predicts and ranks (pipebd_core/bench/accuracy.py).
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import Field

from pipebd_core.documents.base import Document
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.parts import Part

SHARED_CORES = 0.15  # other processes using more cores than this during an arm: the arm is shared


class Machine(Part):
    """What the bench ran on."""

    cpu_model: str
    cpu_flags: list[str] | None = None  # the flags that change kernels' speed (avx512*, amx*); None: not recorded
    cores: int  # logical CPUs
    memory_bytes: int
    gpus: list[str]  # CUDA device names; empty without a GPU
    python: str
    torch: str


class KernelSpeed(Part):
    """The reference kernels' speed on one thread (pipebd_core/bench/reference.py)."""

    matmul_gflops: float
    conv_gflops: float


class RunSpeed(Part):
    """The reference speed measured right after one run ("<arm>-<repeat>") ended."""

    run: str
    speed: KernelSpeed


class Reference(Part):
    """The reference speed at the start of the bench (just before its profile is measured or read), right after
    the profile, after each of its runs (in the order they ran; a run measured again by `--again-shared` keeps its
    last) and at its end (None while it runs). A record written before `after_runs` (or `after_profile`) existed
    has none."""

    start: KernelSpeed
    end: KernelSpeed | None = None
    after_runs: list[RunSpeed] = Field(default_factory=list)
    after_profile: KernelSpeed | None = None


Pace = Literal["slowest_step", "slowest_rank"]
SLOWEST_STEP: Pace = "slowest_step"  # the rule of records before the pace: each step, the slowest rank's time
SLOWEST_RANK: Pace = "slowest_rank"  # each step as the rank with the slowest pace over the timed steps ran it


class TimingRule(Part):
    """The rule a run was timed by: its first `warmup_steps` global steps left out, the next `timed_steps`
    measured. A step's time on a rank is the time from the end of the rank's task before it to the end
    of its last task of that step, summed over its tasks of that step. `pace` says which rank's steps are
    the run's: SLOWEST_RANK, those of the rank whose timed steps took longest in all (the run's pace: a
    pipeline's ranks keep one pace, however their steps interleave); SLOWEST_STEP (records made before
    it, which lack the field), each step the slowest rank's time at that step, which overstates a
    decoupled pipeline whose ranks' long and short steps alternate out of phase. The same rule for every
    mode, pipelined or not. `left_out`: steps in that window not timed (the first step of an end-to-end
    training epoch, whose time holds the checkpoint and evaluation)."""

    warmup_steps: int
    timed_steps: int
    left_out: list[int] = Field(default_factory=list)
    pace: Pace = SLOWEST_STEP


class Load(Part):
    """The node while a run ran: node busy CPU time (/proc/stat) minus the bench's own process tree's,
    over the run's wall time."""

    wall_s: float
    other_cores: float  # cores other processes used on average
    shared: bool  # other_cores > SHARED_CORES


class ArmRun(Part):
    """One repeat of one arm."""

    repeat: int
    step_s: list[float]  # every timed global step, in order, seconds
    measured_step_s: float  # their mean
    predicted_step_s: float | None  # the plan's prediction from the profile (None: planned without one)
    profile_hash: str | None  # the profile.json this run planned from (None: none)
    timing: TimingRule  # as found in this run's telemetry
    load: Load
    stages: list[StageSpan]  # the plan it ran (empty for dp and ls; ddp: the whole network, replicated)
    peak_mem_bytes: list[int]  # per rank
    # end-to-end training only:
    strategy: str | None = None  # the strategy it ran (what auto chose)
    bubble: list[float] | None = None  # per rank, the share of a timed step it waited (receives, sends, idle)
    stage_s: list[float] | None = None  # per rank, compute seconds a timed step (median)
    predicted_stage_s: list[float] | None = None  # per stage, the plan's prediction
    part_s: list[dict[str, float]] | None = None  # per rank, median seconds a timed step of F, B, I, W, optim


class Arm(Part):
    """One mode, every repeat."""

    name: str
    runs: list[ArmRun]

    @property
    def step_s(self) -> float:
        """The median of the repeats' measured steps."""
        return statistics.median(run.measured_step_s for run in self.runs)

    @property
    def interval(self) -> tuple[float, float]:
        """The lowest and the highest repeat."""
        steps = [run.measured_step_s for run in self.runs]
        return min(steps), max(steps)


class Bound(Part):
    """The measured bound: T1, one rank running all the teacher and student work of a global step alone
    (the same global batch, one stage of every block), measured in the same bench; ideal_s = T1 / nproc."""

    # the median of the one-rank runs (end-to-end training: ddp on one rank, the full batch); None while a
    # bench that has not run the bound yet is under way (its record's runs_left say so)
    t1_s: float | None
    ideal_s: float | None
    runs: list[ArmRun]
    profile_ideal_s: float | None  # the profile's own prediction of perfectly divided work (not a bound)


class PlanAccuracy(Part):
    """One candidate plan of an accuracy benchmark: what the profile predicted, what its arm measured, and
    what the profile calibrated on another candidate's run predicted."""

    arm: str  # the arm that ran it (the first name it was a candidate under)
    also: list[str]  # the other names it was a candidate under (deduplicated: one plan, one arm)
    # distillation: a mode's own plan, the planner's top five, drawn with the seed; end-to-end training: a
    # strategy on the spec's partitioner's cut, or a pipelined strategy on another partitioner's
    source: Literal["mode", "top", "drawn", "strategy", "partition"]
    mode: str  # the schedule it ran (hybrid: explicit stages)
    stages: list[StageSpan]  # empty for dp and ls
    # end-to-end training, a pipeline: every partitioner whose cut it ran (the spec's for a strategy's own
    # candidate); empty for ddp, for distillation and in a record from before the partitions table
    partitioners: list[str] = Field(default_factory=list)
    moved: list[int] = Field(default_factory=list)  # per boundary, the input channels moved (LayerPipe); empty: none
    predicted_step_s: float  # from the frozen profile (no calibration)
    measured_step_s: float  # the median of its repeats
    calibrated_step_s: float | None  # from the frozen profile with `calibrated_from`'s calibration
    calibrated_from: str | None  # the arm whose run calibrated it (never its own); None: no run calibrated
    # whether the guard (planning/calibration_guard.py) applied that calibration: False where it disagreed
    # with the profile beyond the noise (the calibrated figures then use the profile's prediction); None in
    # a record from before the guard (always applied)
    calibration_applied: bool | None = None


class AccuracyFigures(Part):
    """How well predictions match measurements over the candidate plans."""

    mape: float  # mean of |predicted - measured| / measured
    rank_correlation: float | None  # Kendall's tau (tau-b) of predicted and measured order; None under 2 plans
    chosen: str  # the arm of the plan the planner picks with these predictions
    chosen_regret: float  # the chosen plan's measured step over the best measured, minus one


class Accuracy(Part):
    """`pipebd bench --accuracy`: the planner's predictions checked against runs of every candidate plan.
    The top-level figures are from the frozen profile alone; `calibrated` from the profile calibrated on
    a different run than the one measured (`rule` says which)."""

    seed: int  # drew the `drawn` candidates
    plans: list[PlanAccuracy]
    mape: float
    rank_correlation: float | None
    chosen: str  # the planner's top plan (what auto runs)
    chosen_regret: float
    calibrated: AccuracyFigures | None  # None: no run wrote a calibration
    rule: str  # how each plan's calibration was chosen


class BenchRecord(Document):
    """bench.json: one benchmark."""

    NAME = "benchmark record"
    VERSION = 1

    phase: Literal["distill", "finetune"] = "distill"
    compares: Literal["modes", "strategies", "partitioners", "plans"] = "modes"  # what the arms are
    baseline: str = "dp"  # the arm every other is compared with (where it ran)
    strategy: str | None = None  # partitioners: the one pipelined strategy every arm ran
    name: str  # the spec's
    commit: str | None  # git HEAD of the PipeBD that ran, "+dirty" with uncommitted changes; None outside git
    machine: Machine
    reference: Reference | None = None  # the machine's reference speed at the start and end; None: not measured
    spec: dict[str, Any]
    nproc: int
    batch_size: int
    steps: int  # optimiser steps each run
    repeats: int
    timing: TimingRule  # the rule every run was timed by
    profile_hash: str  # the frozen profile every arm planned from
    shared_cores: float = SHARED_CORES
    arms: list[Arm]
    bound: Bound
    split_cost: float | None = None  # end-to-end training: (I + W) / B over the layers, from the profile
    accuracy: Accuracy | None = None  # compares plans: predictions against measurements (bench --accuracy)
    fitted: str | None = None  # `--minutes`: what it chose (steps, repeats, the predicted minutes)
    seed: int | None = None  # distillation's --accuracy: the seed that drew plans (what --resume draws again)
    # the runs still to run ("<arm>-<repeat>", in the order they run): written after every run, so a bench
    # stopped half-way leaves a valid record that `pipebd bench --resume` continues; empty: complete
    runs_left: list[str] = Field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.runs_left


class ReplanRun(ArmRun):
    """One run of a re-planning benchmark's variant: timed over its last launch (the plan it ended with)."""

    calibrated_step_s: float | None  # its last calibration's prediction for the plan it ran
    calibration_measured_step_s: float | None  # what that calibration measured
    replans: int
    declined: list[str]  # why each re-plan it considered was declined


class ReplanVariant(Part):
    name: str  # loaded, replanned or clean (pipebd_core/bench/replan.py)
    runs: list[ReplanRun]


class ProfileUsed(Part):
    """A profile a re-planning benchmark measured, and how far it can be trusted (planning/trust.py)."""

    hash: str
    trusted: bool
    flags: list[str]
    other_cores: float | None  # what other processes used while it was measured


class ReplanBenchRecord(Document):
    """bench.json of `pipebd bench --replan`: auto from a loaded profile with and without re-planning, and
    from a clean one."""

    NAME = "re-planning benchmark record"
    VERSION = 1

    name: str
    commit: str | None
    machine: Machine
    spec: dict[str, Any]
    nproc: int
    steps: int
    repeats: int
    load_cores: int  # processes kept busy while the loaded profile was measured
    profiles: dict[str, ProfileUsed]  # clean, loaded
    variants: list[ReplanVariant]
