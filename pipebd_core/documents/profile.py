"""The block profile (profile.json and the profile cache's entries): every block measured on the
devices a job uses (pipebd_core/profile/blocks.py writes it; the cost model, the planner, the trust
report and `pipebd profile` read it).

Per block and per per-replica batch size: the teacher's forward, the student's step and, for a searched
student, its architecture step (`Timing`s), the bytes the student's backward keeps (and its peak on
CUDA); for a transformer search, at the global batch, every candidate's forward; per group size k, the
student's step as a replicated stage trains it (its BatchNorm normalising over the k ranks' shards of the
batch, with a collective per layer in its forward and backward) and the all-reduce of its gradients; per
boundary, the one-way send of its tensor; per batch, loading the data; per link (`intra`: between ranks of
one node, `inter`: between nodes, on a profile measured across nodes), its one-way send time fitted as
latency + bytes / bandwidth. `conditions` say under what load
it was measured; `calibration`, once a run calibrated it, what training measured.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pipebd_core.documents.base import Document
from pipebd_core.documents.calibration import Calibration


class Timing(BaseModel):
    """One measurement: the median of its trials (seconds), their spread (p90 - p10) / median, how many
    trials there were (0: not measured) and how many times it was taken again because they disagreed."""

    model_config = ConfigDict(extra="forbid")

    median: float
    spread: float = 0.0
    trials: int = 0
    remeasured: int = 0


class BlockProfile(BaseModel):
    """One block, per per-replica batch size (the tables' keys) and per all-reduce group size."""

    model_config = ConfigDict(extra="forbid")

    teacher_s: dict[int, Timing]  # forward
    student_s: dict[int, Timing]  # forward, backward and update
    student_arch_s: dict[int, Timing] = {}  # a supernet's architecture step (trials 0: none)
    saved_bytes: dict[int, int]  # what autograd keeps for the student's backward
    student_peak_bytes: dict[int, int] | None = None  # CUDA: a student step's peak allocation
    teacher_param_bytes: int
    student_param_bytes: int
    allreduce_s: dict[int, Timing]  # per group size k >= 2
    # per group size k >= 2: the student step at ceil(B/k) rows with its BatchNorm synchronised over a group
    # of k ranks, every group measuring at once (version 2; empty in a profile written by hand: the plain step)
    student_group_s: dict[int, Timing] = {}
    # a transformer search (workloads/candidates.py): at the global batch, each candidate's forward in
    # workload.replacements' order and the teacher layer's alone, on the same input (the embedding of block 0
    # applied first): what workload.budget.latency bounds; empty where the student is not a search
    candidate_forward_s: list[Timing] = []
    layer_forward_s: Timing | None = None

    def timings(self) -> Iterator[tuple[str, dict[int, Timing]]]:
        """(what, table) of each timed measurement: teacher, student, student_arch."""
        yield "teacher", self.teacher_s
        yield "student", self.student_s
        yield "student_arch", self.student_arch_s


class LinkFit(BaseModel):
    """A link's one-way send of n bytes: latency_s + n / bytes_per_s, fitted to the sends measured on it
    (`points`: [bytes, seconds]) or stated (a what-if: `pipebd plan --link-gbps`, points empty)."""

    model_config = ConfigDict(extra="forbid")

    latency_s: float = Field(ge=0)
    bytes_per_s: float = Field(gt=0)
    points: list[tuple[int, float]] = []
    # the sends took no longer as they grew (small sends on a fast link): latency_s is their median and
    # bytes_per_s only a lower bound, the largest send over that median
    latency_bound: bool = False

    def send_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    @property
    def gbit_per_s(self) -> float:
        return self.bytes_per_s * 8 / 1e9


class Conditions(BaseModel):
    """The load a profile was measured under (planning/trust.py judges it)."""

    model_config = ConfigDict(extra="forbid")

    cpus: int
    other_cpu_cores: float  # CPU other processes used on the node while the ranks measured, in cores
    load_average_1m: float
    gpu_other_processes: list[list[int]] | None = None  # per rank, other pids on its GPU (None: CPU)
    noisy_spread: float  # the spread above which a measurement was taken again


class Profile(Document):
    """profile.json: the block profile of one workload on one kind and count of device."""

    NAME = "block profile"
    VERSION = 2  # 2: student_group_s, the replicated student step (version 1 profiles are measured again)
    LATER_FIELDS: ClassVar[dict[str, object]] = {"chain_s": {}}  # added to version 2 (Document.LATER_FIELDS)

    nproc: int  # ranks in all (nodes x ranks per node)
    nodes: int = 1  # the nodes it was measured across (ranks r and s share one when r // per node == s // per node)
    batch_size: int
    batch_sizes: list[int]  # every per-replica batch a plan can give a block, largest first
    device: str
    device_memory_bytes: int
    baseline_bytes: int  # what a rank holds before any block
    shapes: list[list[int]]  # per boundary (input first), one sample's tensor shape
    boundary_bytes_per_sample: list[int]  # per boundary, as the blocks produce it
    blocks: list[BlockProfile]
    data_s: dict[int, Timing]  # loading a batch
    # per batch, every block's work (teacher forward, student step) run one after another, as a training step
    # runs it: more than the blocks timed each in a loop of its own where they evict each other from the
    # caches (planning/distill_costmodel.py: chain_factors); measured on CPU only, empty where not measured
    chain_s: dict[int, Timing] = {}
    p2p_s: list[dict[int, Timing]]  # per boundary, one-way send between two ranks of one node
    links: dict[str, LinkFit] = {}  # "intra" (ranks of one node), "inter" (nodes): absent where not measured
    measured_at: float | None = None  # seconds since the epoch (None: a profile written by hand)
    conditions: Conditions | None = None  # None: a profile written by hand, load unknown
    calibration: Calibration | None = None

    def uncalibrated(self) -> Profile:
        """The profile as measured (its calibration left out)."""
        return self.model_copy(update={"calibration": None})

    def calibrated(self, calibration: Calibration) -> Profile:
        """The measured numbers with `calibration` (in place of any it had)."""
        return self.model_copy(update={"calibration": calibration})
