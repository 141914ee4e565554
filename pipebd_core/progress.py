"""Follow a running job from its telemetry files: progress, losses and throughput.

Used by `pipebd run` for its progress bar and by the service's workers to stream metrics.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipebd_core.plan import Plan
from pipebd_core.rundir import RunDir
from pipebd_core.schedule import count_tasks


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


@dataclass
class Progress:
    """The latest state of every rank, folded from their telemetry lines."""

    plan: Plan
    started: float = field(default_factory=time.time)
    latest: dict[int, dict[str, Any]] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    totals: list[int] = field(default_factory=list)  # tasks per rank in a whole run, counted once

    def __post_init__(self) -> None:
        steps, start = self.plan.details["total_steps"], [0] * self.plan.num_blocks
        self.totals = [count_tasks(self.plan, rank, steps, start) for rank in range(self.plan.nproc)]

    def add(self, record: dict[str, Any]) -> None:
        self.latest[record["rank"]] = record
        for block, value in record.get("loss", {}).items():
            self.losses[int(block)] = value

    @property
    def fraction(self) -> float:
        totals = self.totals
        done = [self.latest.get(rank, {}).get("done", 0) for rank in range(self.plan.nproc)]
        # a resumed rank reports its own total, which is smaller: count its skipped tasks as done
        for rank, record in self.latest.items():
            done[rank] += totals[rank] - record["total"]
        return sum(done) / max(1, sum(totals))

    def samples_per_s(self) -> float:
        """Samples taken through every block per second, so every mode is measured in the same unit."""
        elapsed = max(1e-9, time.time() - self.started)
        return self.fraction * self.plan.details["total_steps"] * self.plan.batch_size / elapsed

    def describe(self) -> str:
        slowest = min(self.latest.values(), key=lambda r: r["done"] / max(1, r["total"]), default=None)
        where = f"epoch {slowest['epoch']} step {slowest['step']}" if slowest else "starting"
        loss = sum(self.losses.values()) / len(self.losses) if self.losses else float("nan")
        return f"{self.fraction:6.1%} {where} | mean block loss {loss:.4g} | {self.samples_per_s():.1f} samples/s"


class MetricsFollower:
    """Tails metrics/rank-*.jsonl of a run and keeps a Progress up to date."""

    def __init__(self, run_dir: RunDir, plan: Plan) -> None:
        self.tails = [FileTail(run_dir.metrics(rank)) for rank in range(plan.nproc)]
        self.progress = Progress(plan)

    def poll(self) -> list[dict[str, Any]]:
        records = []
        for tail in self.tails:
            for line in tail.read_new():
                record = json.loads(line)
                self.progress.add(record)
                records.append(record)
        return records
