"""The summary (summary.json): what a job produced, in numbers.

The finalize phase writes it after distillation (pipebd_core/distill/finalize.py): the final loss of
every block, top-1 of the compressed student and of the teacher where the data set has labels (or held-out
perplexity, for a language model), a search's architecture (its blocks, as architecture.json has them). The
evaluate phase (pipebd_core/finetune/evaluate.py) adds its `finetune`
section: top-1 before and after end-to-end training and of the teacher, parameters and FLOPs, and the
wall time of every phase; a job that only trains has a summary of its name and that section.

`to_json` writes the fields a phase set and no others, so the file (served as it is by the API's
artifacts route) keeps the shape it always had, `format_version` added.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from pipebd_core.documents.architecture import ArchitectureBlock
from pipebd_core.documents.base import Document


class ModelSize(BaseModel):
    """A network's parameters and forward FLOPs per sample."""

    model_config = ConfigDict(extra="forbid")

    params: int
    flops: float


class FinetuneReport(BaseModel):
    """The evaluate phase's section: the network trained end to end, next to where it started and its teacher."""

    model_config = ConfigDict(extra="forbid")

    strategy: str  # the finetune plan's strategy (ddp, gpipe, 1f1b, zb, ...)
    top1_before: float | None  # None where the data set has no labels
    top1_after: float | None
    student: ModelSize
    teacher_top1: float | None = None  # without a teacher: absent
    teacher: ModelSize | None = None
    # a language model (workload kind transformer): held-out perplexity instead of top-1
    perplexity_before: float | None = None
    perplexity_after: float | None = None
    teacher_perplexity: float | None = None
    phase_s: dict[str, float | None] = {}  # wall seconds of every phase of the job (None: it did not run)


class AccuracyReport(BaseModel):
    """The finalize phase's measure of the distilled network (and its teacher): the summary's fields of
    that name. Only the fields it set reach summary.json (a top-1 of None included: measured, no labels)."""

    model_config = ConfigDict(extra="forbid")

    student_top1: float | None = None
    teacher_top1: float | None = None
    top1_note: str | None = None  # why no top-1 is given
    student_perplexity: float | None = None
    teacher_perplexity: float | None = None
    # a language model: the whole network's parameters and the bytes its attention layers add to the KV cache
    # per token, the distilled one's and its teacher's (before and after, beside the perplexity)
    student_params: int | None = None
    teacher_params: int | None = None
    student_kv_cache_bytes: int | None = None
    teacher_kv_cache_bytes: int | None = None


class Summary(Document):
    """summary.json: written by the finalize phase, completed by the evaluate phase."""

    NAME = "summary.json"
    VERSION = 1

    name: str  # the job's name
    mode: str | None = None  # distillation: the schedule mode, as the spec gave it
    nproc: int | None = None
    steps_per_block: int | None = None
    final_loss: dict[int, float] | None = None  # per block, at its last checkpoint
    warnings: list[str] | None = None  # what the workload warned about while it was built
    architecture: list[ArchitectureBlock] | None = None  # NAS: the searched architecture
    student_top1: float | None = None  # the compressed student's top-1 (None: the data set has no labels)
    teacher_top1: float | None = None
    top1_note: str | None = None  # why no top-1 is given (synthetic labels, a language model)
    student_perplexity: float | None = None  # text: the compressed student's held-out perplexity
    teacher_perplexity: float | None = None
    student_params: int | None = None  # text: the distilled network's parameters, all of them
    teacher_params: int | None = None
    student_kv_cache_bytes: int | None = None  # text: KV-cache bytes per token of the distilled network's layers
    teacher_kv_cache_bytes: int | None = None
    finetune: FinetuneReport | None = None  # once the evaluate phase ran

    def to_json(self) -> dict[str, Any]:
        """The fields the phases set (a top-1 of None included: measured, no labels), and the format version."""
        return self.model_dump(mode="json", exclude_unset=True)
