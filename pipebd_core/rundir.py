"""The run directory: the contract between the launcher, the ranks and the service.

Everything a job produces lives here, so it survives any crash of the service:

    spec.json                 the resolved spec
    plan.json                 stages, routes, what each rank runs, block shapes and cost estimates
    events.jsonl              lifecycle events (launched, checkpoint, rank_error, finished, ...)
    metrics/rank-<r>.jsonl    one telemetry line per rank per task
    logs/rank-<r>.log         each rank's stdout and stderr (when launched by the CLI or a worker)
    errors/rank-<r>.json      the traceback of a rank that raised
    checkpoints/block-<i>/step-<s>.pt   student, optimiser state and step of block i after step s
    student.pt                state_dict of nn.ModuleList `blocks` (keys blocks.<i>.<param>)
    compressed_model.pt       the assembled compressed network (compression workloads)
    architecture.json         nas: the chosen candidate of every searchable layer, per block
    searched_model.pt         nas: the searched network as a standalone model
    summary.json              final losses, accuracies, wall time
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def student(self) -> Path:
        return self.root / "student.pt"

    @property
    def compressed_model(self) -> Path:
        return self.root / "compressed_model.pt"

    @property
    def architecture(self) -> Path:
        return self.root / "architecture.json"

    @property
    def searched_model(self) -> Path:
        return self.root / "searched_model.pt"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def metrics(self, rank: int) -> Path:
        return self.root / "metrics" / f"rank-{rank}.jsonl"

    def log(self, rank: int) -> Path:
        return self.root / "logs" / f"rank-{rank}.log"

    def error(self, rank: int) -> Path:
        return self.root / "errors" / f"rank-{rank}.json"

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())

    def write_json(self, path: Path, data: Any) -> None:
        """Write atomically: readers never see half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(data, indent=2, default=str))
        temporary.replace(path)

    def rank_errors(self) -> list[dict[str, Any]]:
        """Errors written by ranks that raised, earliest first (the first is the root cause)."""
        folder = self.root / "errors"
        errors = [json.loads(path.read_text()) for path in sorted(folder.glob("rank-*.json"))]
        return sorted(errors, key=lambda error: error.get("time", 0.0))

    def clear_errors(self) -> None:
        for path in (self.root / "errors").glob("rank-*.json"):
            path.unlink()
