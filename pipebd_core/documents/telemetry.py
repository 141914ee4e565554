"""The telemetry line (metrics/<phase>/rank-<r>.jsonl): one JSON line per rank per step of a training phase.

Three documents share the position of a line (`time`, `rank`, `epoch`, `step`): a distillation task's
`DistillLine` (loss per block, seconds per step phase and per block, NAS paths and architecture
probabilities), an end-to-end training step's `FinetuneLine` (loss and train accuracy of the last stage,
seconds per action, its timeline of micro-batch actions) and the `EvalLine` rank 0 writes after each
evaluation of the finetune phase (top-1). Both step lines count the tasks done (`done` of `total` this
launch, `skipped` by earlier ones) and the rank's memory.

`to_line` is the one writer (a line of compact JSON, optional fields left out when absent, as the
ranks have always written them); `parse_line` and `read_line` the readers, which pick the document
from the phase (and, in the finetune phase, `eval`). A line without a format version was written
before lines were versioned: DocumentError, like every other document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from pipebd_core.documents.base import Document, DocumentError
from pipebd_core.documents.phases import DISTILL, FINETUNE

Round = Literal["weights", "arch"]  # a distillation task trains the students' weights, or a NAS architecture
Action = tuple[str, int | None, float, float]  # (kind, micro-batch, start, end): seconds from the step's start


class Position(BaseModel):
    """Where a line stands: when it was written, by which rank, at which epoch and step."""

    def line_json(self) -> dict[str, Any]:
        """The JSON value of the line as written: optional fields left out when absent."""
        return self.model_dump(mode="json", exclude_none=True)

    time: float  # seconds since the epoch, when the rank wrote it
    rank: int
    epoch: int
    step: int


class StepCounts(Position):
    """What every step line carries: the tasks done so far and the rank's memory."""

    done: int  # tasks this launch did, this one included
    total: int  # tasks this launch does
    skipped: int = 0  # tasks done before this launch (a resume, a re-plan)
    samples: int | None = None  # rows this task trained on (None: a pipeline stage that sees no labels)
    peak_mem: int  # bytes: CUDA max allocated, or the process's peak resident set on the CPU
    cur_mem: int  # bytes now, the same way

    @property
    def seq(self) -> int:
        """This line's place among its rank's tasks of the phase over every launch."""
        return self.done + self.skipped


class BlockSeconds(BaseModel):
    """Each block's time this task: the teacher's forward, the student's forward, backward and update."""

    teacher: dict[int, float]
    student: dict[int, float]


class DistillLine(Document, StepCounts):
    """One distillation task of one rank (pipebd_core/distill/runtime.py)."""

    NAME = "distill telemetry line"
    VERSION = 1

    round: Round = "weights"
    samples: int  # rows this task trained on
    blocks: list[int]  # the blocks this task trained
    loss: dict[int, float]  # per trained block
    phases: dict[str, float]  # seconds per kind of work (pipebd_core.rundir.STEP_PHASES)
    block_s: BlockSeconds
    paths: dict[int, list[list[int]]] | None = None  # NAS: the candidates each layer drew this step
    gpu_util: int | None = None  # percent, CUDA ranks where NVML reports it
    arch: dict[int, list[list[float]] | None] | None = None  # an architecture round: each block's probabilities

    def to_json(self) -> dict[str, Any]:
        return self.line_json()


class FinetuneLine(Document, StepCounts):
    """One end-to-end training step of one rank (pipebd_core/finetune/rank.py)."""

    NAME = "finetune telemetry line"
    VERSION = 1

    phase: Literal["finetune"] = FINETUNE
    times: dict[str, float]  # seconds per action (finetune/rank.py's TIMES), adding up to the step
    elapsed: float  # the step's seconds
    loss: float | None = None  # of what the rank saw: the whole network (DDP), the last stage (a pipeline)
    acc: float | None = None  # train accuracy, where the loss is
    timeline: list[Action] = []
    allreduce_span: float | None = None  # DDP: seconds from the first gradient bucket's all-reduce to the last
    w_calls: int | None = None  # a pipeline: deferred weight-gradient computations run (zero-bubble)
    moved_combined: int | None = None  # a pipeline: micro-batches whose moved delta share this rank combined
    moved_computed: int | None = None  # ... and computed (finetune/moved.py)

    def to_json(self) -> dict[str, Any]:
        return self.line_json()


class EvalLine(Document, Position):
    """Rank 0's evaluation of the whole network after `step` (every `eval_every` epochs of the finetune phase)."""

    NAME = "finetune evaluation line"
    VERSION = 1

    phase: Literal["finetune"] = FINETUNE
    eval: Literal[True] = True
    top1: float | None = None  # None where the data set has no labels, or for a language model
    perplexity: float | None = None  # a language model's held-out perplexity (workload kind transformer)

    def to_json(self) -> dict[str, Any]:
        return self.line_json()


StepLine = DistillLine | FinetuneLine
TelemetryLine = DistillLine | FinetuneLine | EvalLine


def to_line(line: TelemetryLine) -> str:
    """The line written to metrics/<phase>/rank-<r>.jsonl (newline included)."""
    return line.model_dump_json(exclude_none=True) + "\n"


def parse_line(phase: str, data: object) -> TelemetryLine:
    """A telemetry line of `phase` from its JSON value (as read from a file, or stored in the database)."""
    if phase == DISTILL:
        return DistillLine.from_json(data)
    if phase != FINETUNE:
        raise ValueError(f"{phase} writes no telemetry lines; the training phases are {DISTILL} and {FINETUNE}")
    if isinstance(data, dict) and data.get("eval"):
        return EvalLine.from_json(data)
    return FinetuneLine.from_json(data)


def read_line(phase: str, text: str | bytes) -> TelemetryLine:
    """A telemetry line of `phase` from its text."""
    return parse_line(phase, json.loads(text))


def step_line(phase: str, data: object) -> StepLine:
    """A step's telemetry line of `phase` (not an evaluation) from its JSON value."""
    line = parse_line(phase, data)
    if isinstance(line, EvalLine):
        raise DocumentError(f"a {phase} step's telemetry line was wanted, not an evaluation: {data}")
    return line


@dataclass
class FileTail:
    """Reads the complete lines appended to one file since the last call."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def read_new(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines if line]
