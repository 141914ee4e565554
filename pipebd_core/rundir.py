"""The run directory: the contract between the launcher, the ranks and the service.

Everything a job produces lives here, so it survives any crash of the service. Every path below is
spelt out once, in `RunDir`; nothing else joins names onto a run directory.

    spec.json                          the resolved spec
    phases.json                        the job's phases in order, each with its state and outcome
    profile.json                       the profile the plan was made from (measured, or the cached one)
    plan.json                          stages, routes, what each rank runs, block shapes and cost estimates
    events.jsonl                       lifecycle events (phase_started, launched, checkpoint, finished, ...)
    logs/<phase>/launcher.log          torchrun's output for that phase (or the phase process's own)
    logs/<phase>/rank-<r>.log          each rank's stdout and stderr
    errors/<phase>/rank-<r>.json       the traceback of a rank that raised
    metrics/<phase>/rank-<r>.jsonl     one telemetry line per rank per task
    checkpoints/block-<i>/step-<s>.pt  student, optimiser state and step of block i after step s
    checkpoints/finetune/block-<s>/step-<n>.pt   finetune: pipeline stage s (ddp: block-0, the whole network)
    student.pt                         state_dict of nn.ModuleList `blocks` (keys blocks.<i>.<param>)
    compressed_model.pt                the assembled compressed network (compression workloads)
    architecture.json                  nas: the chosen candidate of every searchable layer, per block
    searched_model.pt                  nas: the searched network as a standalone model
    layer_profile.json                 finetune: every layer's F, B, I and W times and bytes (measured or cached)
    finetune_plan.json                 finetune: strategy, stage cuts, micro-batches, every rank's actions
    finetuned_model.pt                 finetune: the trained network's state_dict
    finetuned_model.pt2                finetune: the same network as a torch.export program
    teacher.pt                         kind train: the trained classifier, a torchvision-format state_dict
    summary.json                       final losses, accuracies, wall time

`OUTPUTS` lists the top-level files with their media type and meaning: the service offers exactly
these for download.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The kinds of work a telemetry line times, in seconds per step ("phases" of metrics/<phase>/rank-<r>.jsonl);
# here, not in telemetry.py, so that readers of the lines (the API, the dashboard) need not import torch.
STEP_PHASES = ("data", "recv_wait", "teacher", "send", "student", "allreduce", "barrier", "optim")
DISTILL = "distill"  # the phase whose files a caller means when it names none (see pipebd_core.phases)


@dataclass(frozen=True)
class Output:
    """A documented top-level file of a run directory."""

    name: str
    media_type: str
    description: str


OUTPUTS: tuple[Output, ...] = (
    Output("student.pt", "application/octet-stream", "trained students: state_dict, keys blocks.<i>.*"),
    Output("compressed_model.pt", "application/octet-stream", "assembled compressed network (torch.load)"),
    Output("architecture.json", "application/json", "nas: the chosen candidate of every searchable layer"),
    Output("searched_model.pt", "application/octet-stream", "nas: the searched network, standalone (torch.load)"),
    Output("finetuned_model.pt", "application/octet-stream", "finetune: the trained network's state_dict"),
    Output("finetuned_model.pt2", "application/octet-stream", "finetune: the trained network, torch.export"),
    Output("teacher.pt", "application/octet-stream", "kind train: the classifier, torchvision state_dict"),
    Output("summary.json", "application/json", "final losses and accuracies"),
    Output("plan.json", "application/json", "the resolved plan"),
    Output("finetune_plan.json", "application/json", "finetune: strategies ranked, stages, actions per rank"),
    Output("layer_profile.json", "application/json", "finetune: every layer's measured F, B, I, W and bytes"),
    Output("profile.json", "application/json", "the profile the plan was made from"),
    Output("calibration.json", "application/json", "block times training measured, against the profile"),
    Output("phases.json", "application/json", "the job's phases with their states and outcomes"),
    Output("spec.json", "application/json", "the resolved spec"),
    Output("events.jsonl", "application/x-ndjson", "lifecycle events written by the engine"),
)


@dataclass(frozen=True)
class RunDir:
    root: Path

    def output(self, name: str) -> Path:
        """The path of documented output `name` (see OUTPUTS)."""
        if name not in {output.name for output in OUTPUTS}:
            raise KeyError(f"{name!r} is not a run-directory output; outputs: {', '.join(o.name for o in OUTPUTS)}")
        return self.root / name

    @property
    def spec(self) -> Path:
        return self.output("spec.json")

    @property
    def phases(self) -> Path:
        return self.output("phases.json")

    @property
    def profile(self) -> Path:
        return self.output("profile.json")

    @property
    def plan(self) -> Path:
        return self.output("plan.json")

    @property
    def calibration(self) -> Path:
        return self.output("calibration.json")

    @property
    def events(self) -> Path:
        return self.output("events.jsonl")

    @property
    def summary(self) -> Path:
        return self.output("summary.json")

    @property
    def student(self) -> Path:
        return self.output("student.pt")

    @property
    def compressed_model(self) -> Path:
        return self.output("compressed_model.pt")

    @property
    def architecture(self) -> Path:
        return self.output("architecture.json")

    @property
    def searched_model(self) -> Path:
        return self.output("searched_model.pt")

    @property
    def layer_profile(self) -> Path:
        return self.output("layer_profile.json")

    @property
    def finetune_plan(self) -> Path:
        return self.output("finetune_plan.json")

    @property
    def finetuned_model(self) -> Path:
        return self.output("finetuned_model.pt")

    @property
    def exported_model(self) -> Path:
        return self.output("finetuned_model.pt2")

    @property
    def teacher(self) -> Path:
        return self.output("teacher.pt")

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def finetune_checkpoints(self) -> Path:
        return self.checkpoints / "finetune"

    def logs(self, phase: str = DISTILL) -> Path:
        return self.root / "logs" / phase

    def log(self, rank: int, phase: str = DISTILL) -> Path:
        return self.logs(phase) / f"rank-{rank}.log"

    def launcher_log(self, phase: str = DISTILL) -> Path:
        return self.logs(phase) / "launcher.log"

    def metrics(self, rank: int, phase: str = DISTILL) -> Path:
        return self.root / "metrics" / phase / f"rank-{rank}.jsonl"

    def errors(self, phase: str = DISTILL) -> Path:
        return self.root / "errors" / phase

    def error(self, rank: int, phase: str = DISTILL) -> Path:
        return self.errors(phase) / f"rank-{rank}.json"

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())

    def write_json(self, path: Path, data: Any) -> None:
        """Write atomically: readers never see half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(data, indent=2, default=str))
        temporary.replace(path)

    def rank_errors(self, phase: str = DISTILL) -> list[dict[str, Any]]:
        """Errors written by ranks of `phase` that raised, earliest first (the first is the root cause)."""
        errors = [json.loads(path.read_text()) for path in sorted(self.errors(phase).glob("rank-*.json"))]
        return sorted(errors, key=lambda error: error.get("time", 0.0))

    def clear_errors(self, phase: str) -> None:
        """Forget the rank errors of an earlier attempt at `phase`."""
        for path in self.errors(phase).glob("rank-*.json"):
            path.unlink()
