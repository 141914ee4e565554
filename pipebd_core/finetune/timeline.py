"""What a finetune rank computed and waited for during a step, as `Segment`s in perf_counter seconds, and the
telemetry line's actions made of them (`timeline`). Both trainers write them: a DDP rank's forward, backward and
all-reduce, a pipeline stage's actions and waits (pipeline.py); kept apart from pipeline.py so that a DDP rank
does not import torch.distributed.pipelining."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipebd_core.documents.telemetry import Action


@dataclass
class Segment:
    kind: str  # F | B | I | W | recv_wait | send | allreduce
    microbatch: int | None
    start: float
    end: float

    def to_json(self) -> list[Any]:
        return [self.kind, self.microbatch, self.start, self.end]


def timeline(segments: list[Segment], start: float) -> list[Action]:
    """The segments as the telemetry line's actions, in seconds from the step's `start`."""
    return [(s.kind, s.microbatch, s.start - start, s.end - start) for s in segments]
