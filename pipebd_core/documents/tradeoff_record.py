"""The trade-off record (benchmarks/records/tiny-llama-tradeoff.json): what one search library buys at
several budgets, chosen again from it, and what choosing again costs beside the search.

Written by benchmarks/tradeoff.py, rendered on the benchmarks page by pipebd_core/bench/page.py. One search
job (the bundled tiny Llama search on a teacher trained here) keeps its candidate library; every row is a
choice made again from it for one budget (`python -m pipebd_core.distill.choose`, no rank launched), with
its chosen layers, held-out perplexity, decoder-layer parameters and KV-cache bytes per token, and the
tokens/s of its exported Hugging Face directory under `transformers` (greedy `generate()` with the KV cache,
a fixed prompt and length, the median of a few repeats); the teacher's directory is the first row. Every
part carries the load other processes put on the node meanwhile: a record with a shared part is no figure.
"""

from __future__ import annotations

from typing import Literal

from pipebd_core.documents.base import Document
from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.parts import Part


class TradeoffSettings(Part):
    """How the record was made (benchmarks/tradeoff.py's options)."""

    example: str  # the search's spec, relative to the repository
    teacher_steps: int  # the teacher's training steps (examples/tiny-llama-teacher.yaml)
    search_steps: int  # the search's distillation steps
    prompt_tokens: int  # generate(): the fixed prompt's length
    new_tokens: int  # and the tokens it generates (greedy, with the KV cache)
    repeats: int  # timed generate() calls per directory (after one warm-up); the median counts


class TradeoffJob(Part):
    """One `pipebd run` job of the record: its wall time, its phases' and the load meanwhile."""

    wall_s: float
    phase_s: dict[str, float]  # wall seconds of every phase that ran (phases.json)
    load: Load


class TradeoffRow(Part):
    """The teacher, or one choice made from the library: what it chose and what it costs and gives."""

    budget: dict[str, float] | None  # fractions of the teacher's layers by cost; None: the teacher
    layers: list[str]  # per decoder layer, the chosen candidate (the teacher: keep)
    perplexity: float  # held-out
    params: int  # decoder layers' parameters
    kv_cache_bytes: int  # decoder layers' KV-cache bytes per token
    model_params: int  # the whole exported directory's (embedding and head included)
    tokens_per_s: float  # generate(): new tokens per second, median of the repeats
    choose_s: float | None  # the choice itself (solve, assemble, evaluate, write: choice.json's seconds)
    command_s: float | None  # the choose command's wall time, interpreter start and imports included
    load: Load  # while this row was chosen and timed


class TradeoffRecord(Document):
    NAME = "trade-off record"
    VERSION = 1

    benchmark: Literal["tradeoff"] = "tradeoff"
    commit: str | None
    machine: Machine
    settings: TradeoffSettings
    teacher_job: TradeoffJob
    search_job: TradeoffJob
    search_budget: dict[str, float]  # the budget the search job itself chose for
    search_layers: list[str]  # and what it chose (the row of that budget must choose the same)
    rows: list[TradeoffRow]  # the teacher first, then one per budget

    @property
    def shared(self) -> bool:
        """Some part ran while other processes used more than SHARED_CORES."""
        loads = [self.teacher_job.load, self.search_job.load, *(row.load for row in self.rows)]
        return any(load.shared for load in loads)
