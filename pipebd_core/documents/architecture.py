"""A search's outcome (architecture.json): the candidate chosen in every searchable layer of every block.

The finalize phase writes it after a search (pipebd_core/distill/finalize.py, from the workload's `derive`):
a NAS search names each block's chosen candidates (workloads/nas.py); a transformer search (workloads/
transformer.py) also gives every candidate's held-out loss, parameters and KV-cache bytes per token, how
the choice was made, the teacher's layer costs, the budget (fractions of the teacher) and what the choice
reached. The job page shows it (app/web/outcome.py); the service serves it as it is.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from pipebd_core.documents.base import Document


class ArchitectureBlock(BaseModel):
    """A search's choice for one block: the candidate chosen in each of its searchable layers."""

    model_config = ConfigDict(extra="forbid")

    block: int
    layers: list[str]
    loss: float | None = None  # a transformer search: the chosen candidate's measured loss (workload.search_loss)
    params: int | None = None  # and its parameters
    kv_cache_bytes: int | None = None  # and the bytes it adds to the KV cache per token
    latency_s: float | None = None  # and its forward as the profile measured it (a latency budget's cost)


class CandidateResult(BaseModel):
    """One candidate of one block of a transformer search, as it was measured on held-out sequences."""

    model_config = ConfigDict(extra="forbid")

    block: int
    name: str  # its replacement (workloads/replacements.py)
    loss: float  # workload.search_loss: against its teacher layer's output (teacher-relayed), or logits_kl
    params: int
    kv_cache_bytes: int | None = None  # per token (0: linear attention, or no attention)
    latency_s: float | None = None  # its forward at the global batch on the job's device (profile.json)


class Architecture(Document):
    """architecture.json: written by the finalize phase of a search."""

    NAME = "architecture.json"
    VERSION = 1

    blocks: list[ArchitectureBlock]
    candidates: list[CandidateResult] | None = None  # a transformer search: every candidate of every block
    chosen_by: str | None = None  # the rule the choice followed
    teacher_params: int | None = None  # the teacher's layers' parameters (what fractions are of)
    teacher_kv_cache_bytes: int | None = None  # the teacher's layers' KV-cache bytes per token
    teacher_latency_s: float | None = None  # the teacher's layers' summed forward, measured as the candidates'
    budget: dict[str, float] | None = None  # workload.budget: a fraction of the teacher's, per cost
    reached: dict[str, float] | None = None  # the choice's cost as the same fractions

    def to_json(self) -> dict[str, Any]:
        """The fields the search set (a NAS search: its blocks only), and the format version."""
        return self.model_dump(mode="json", exclude_none=True)
