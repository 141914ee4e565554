"""The layer profile (layer_profile.json and the layer profile cache's entries): every layer of the
network end-to-end training trains, measured on the job's ranks (pipebd_core/profile/layers.py
writes it; the finetune cost model, planning/finetune_simulate.py, reads it).

Per layer, at one micro-batch and at the largest DDP shard: forward (F), whole backward (B),
input-gradient backward (I), the weight-gradient pass (W), the SGD step, and for a layer whose delta
can be split, its input-gradient kernel whole and in two channel halves; the bytes autograd keeps;
per layer also the bytes per sample of its output and input and the bytes of its parameters and weight.
Between ranks, the one-way send of a tensor by its size in float32 elements; over all ranks, the
all-reduce of the whole network's gradients.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipebd_core.documents.base import Document
from pipebd_core.documents.profile import LinkFit, Timing

LayerBatch = Literal["microbatch", "shard"]
TimedPart = Literal["F", "B", "I", "W", "optim"]


class LayerBatches(BaseModel):
    """The batches a finetune plan can give a layer: one micro-batch, and the largest DDP shard."""

    model_config = ConfigDict(extra="forbid")

    microbatch: int
    shard: int


class LayerTimes(BaseModel):
    """One layer at one batch: its timed parts (seconds) and what its forward keeps for the backward."""

    model_config = ConfigDict(extra="forbid")

    F: Timing
    B: Timing
    I: Timing  # noqa: E741 (the input-gradient backward, named as F, B and W are)
    W: Timing
    optim: Timing
    I_kernel: Timing | None = None  # a splittable layer's input gradient, whole
    I_halves: Timing | None = None  # ... and in two channel halves, put back together
    saved_bytes: int

    def seconds(self, part: TimedPart) -> float:
        timing: Timing = getattr(self, part)
        return timing.median


class LayerProfileEntry(BaseModel):
    """One layer: its times at each batch, and its bytes."""

    model_config = ConfigDict(extra="forbid")

    microbatch: LayerTimes
    shard: LayerTimes
    output_bytes_per_sample: int
    input_bytes_per_sample: int
    param_bytes: int
    weight_bytes: int  # the weight a moved delta share sends (0: none)

    def at(self, batch: LayerBatch) -> LayerTimes:
        return self.microbatch if batch == "microbatch" else self.shard


class LayerProfile(Document):
    """layer_profile.json: every layer of the network to train, on one kind and count of device."""

    NAME = "layer profile"
    VERSION = 1
    # added to version 1 after profiles were first committed (bench/check.py finds them by their digest)
    LATER_FIELDS: ClassVar[dict[str, object]] = {"nodes": 1, "inter": None, "cpus": None, "co_run_optim": []}

    nproc: int  # ranks in all, on every node
    nodes: int = 1  # the nodes they spanned: ranks numbered node by node, nproc / nodes on each
    batches: LayerBatches
    device: str
    device_memory_bytes: int
    shapes: list[list[int]]  # per boundary (the data first), one sample's tensor shape
    layers: list[LayerProfileEntry]
    p2p_s: dict[
        int, Timing
    ]  # one-way send inside a node, by the tensor's size in float32 elements (none without peers)
    inter: LinkFit | None = None  # the link between nodes, fitted to sends from rank 0 to the next node's first rank
    allreduce_s: Timing  # the whole network's gradients over all ranks (trials 0: one rank)
    # per count k of ranks computing at once (1 .. nproc), how much slower each computes than one alone; the
    # layer times were measured with every rank computing (co_run[-1]). Empty: not measured (no slowdown)
    co_run: list[float] = Field(default_factory=list)
    # likewise for the whole network's optimiser step (memory-bound: ranks stepping together share the node's
    # memory bandwidth); the layers' optim times are each rank's alone. Empty: not measured (no slowdown)
    co_run_optim: list[float] = Field(default_factory=list)
    measured_at: float | None = None  # seconds since the epoch (None: a profile written by hand)
    # the node's logical CPUs the ranks shared (planning/cpu_sharing.py); None: not recorded
    cpus: int | None = None
