"""The run directory: the contract between the launcher, the ranks and the service.

Everything a job produces lives here, so it survives any crash of the service. Every path below is
spelt out once, in `RunDir`, and so is every load of the documents the job's processes share (the spec,
the phases record, the events, the block and layer profiles, calibration); nothing else joins names
onto a run directory (a test checks it).

    spec.json                          the resolved spec
    phases.json                        the job's phases in order, each with its state and outcome
    profile.json                       the profile the plan was made from (measured, or the cached one)
    plan.json                          stages, routes, what each rank runs, block shapes and cost estimates
    events.jsonl                       lifecycle events (phase_started, launched, checkpoint, finished, ...)
    logs/<phase>/launcher.log          torchrun's output for that phase (or the phase process's own)
    logs/<phase>/launcher-node-<k>.log  a job on several nodes: torchrun's output on node k > 0
    nodes/node-<k>.json, nodes/rendezvous.json, nodes/ended-<k>.json   a job on several nodes: each node's
                                       token, node 0's launch (phase, rendezvous), how each node's launch ended
    logs/<phase>/rank-<r>.log          each rank's stdout and stderr
    errors/<phase>/rank-<r>.json       the traceback of a rank that raised
    metrics/<phase>/rank-<r>.jsonl     one telemetry line per rank per task
    tensorboard/<phase>/events.out.tfevents.pipebd   a training phase's series as a TensorBoard event file,
                                       written when the phase ends (pipebd_core/tracking/)
    checkpoints/block-<i>/step-<s>.pt  student, optimiser state and step of block i after step s
    checkpoints/finetune/block-<s>/step-<n>.pt   finetune: pipeline stage s (ddp: block-0, the whole network)
    control/stop.json, control/stop_at.json, control/stopped/rank-<r>   a stop request, where the ranks stop,
                                       and which ranks stopped early (pipebd_core/distill/control.py)
    student.pt                         state_dict of nn.ModuleList `blocks` (keys blocks.<i>.<param>)
    compressed_model.pt                the assembled compressed network (compression workloads)
    architecture.json                  a search (nas, transformer): the chosen candidate of every searchable layer
    searched_model.pt                  a search: the searched network as a standalone model
    distilled_state.pt                 transformer: the distilled (compressed or searched) network's state_dict,
                                       rebuilt from the spec and architecture.json (workloads/transformer.py: rebuild)
    distilled_model.pt2                transformer: the same network as a torch.export program (token ids in)
    distilled_hf/                      a language model's compression: the distilled network as a Hugging Face
                                       model directory (config.json, model.safetensors, generation_config.json,
                                       the tokenizer; workloads/hf_directory.py); a vision transformer's where it
                                       is a plain torchvision ViT (ViTForImageClassification: config.json,
                                       model.safetensors, preprocessor_config.json; workloads/vit_directory.py)
    searched_hf/                       a language model's search: the searched network likewise
    layer_profile.json                 finetune: every layer's F, B, I and W times and bytes (measured or cached)
    finetune_plan.json                 finetune: strategy, stage cuts, micro-batches, every rank's actions
    finetuned_model.pt                 finetune: the trained network's state_dict
    finetuned_model.pt2                finetune: the same network as a torch.export program
    finetuned_hf/                      finetune of a transformer job's compression or search: the trained network
                                       as a Hugging Face model directory, as distilled_hf/
    teacher.pt                         kind train: the trained network's state_dict (a classifier: torchvision format)
    teacher_model/                     kind train of a language model (workload.config): the trained model as a
                                       Hugging Face model directory, as distilled_hf/; of a vision transformer:
                                       a ViTForImageClassification directory (workloads/vit_directory.py)
    summary.json                       final losses, accuracies, wall time
    choices/<n>/                       a transformer search chosen again for another budget (distill/choose.py):
                                       choice.json, architecture.json, searched_model.pt, distilled_state.pt,
                                       searched_hf/

`OUTPUTS` lists the top-level files with their media type and meaning, and `FOLDER_OUTPUTS` the
top-level folders that are one model each: the service offers exactly these for download (a folder as one
tar archive, `<name>.tar`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipebd_core.documents.calibration import Calibration
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.errors import RankError
from pipebd_core.documents.finetune_plan import FinetunePlanDocument
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.phases import (
    DISTILL,
    EVALUATE,
    FINALIZE,
    FINETUNE,
    PLAN,
    PLAN_FINETUNE,
    PROFILE,
    PROFILE_FINETUNE,
    PhaseRecord,
    PhasesRecord,
)
from pipebd_core.documents.profile import Profile
from pipebd_core.documents.summary import Summary
from pipebd_core.documents.telemetry import TelemetryLine, read_line

if TYPE_CHECKING:
    from pipebd_core.spec import Spec

# The kinds of work a telemetry line times, in seconds per step ("phases" of metrics/<phase>/rank-<r>.jsonl);
# here, not in telemetry.py, so that readers of the lines (the API, the dashboard) need not import torch.
STEP_PHASES = ("data", "recv_wait", "teacher", "send", "student", "allreduce", "barrier", "optim")


@dataclass(frozen=True)
class Output:
    """A documented top-level file of a run directory."""

    name: str
    media_type: str
    description: str


OUTPUTS: tuple[Output, ...] = (
    Output("student.pt", "application/octet-stream", "trained students: state_dict, keys blocks.<i>.*"),
    Output("compressed_model.pt", "application/octet-stream", "assembled compressed network (torch.load)"),
    Output("architecture.json", "application/json", "a search: the chosen candidate of every searchable layer"),
    Output("searched_model.pt", "application/octet-stream", "a search: the searched network, standalone (torch.load)"),
    Output("distilled_state.pt", "application/octet-stream", "transformer: the distilled network's state_dict"),
    Output("distilled_model.pt2", "application/octet-stream", "transformer: the distilled network, torch.export"),
    Output("finetuned_model.pt", "application/octet-stream", "finetune: the trained network's state_dict"),
    Output("finetuned_model.pt2", "application/octet-stream", "finetune: the trained network, torch.export"),
    Output("teacher.pt", "application/octet-stream", "kind train: the trained network's state_dict (torch.load)"),
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
class FolderOutput:
    """A documented top-level folder of a run directory, downloaded whole (the service streams it as a tar)."""

    name: str
    description: str


# A model folder a job writes joins the downloads by one line here.
FOLDER_OUTPUTS: tuple[FolderOutput, ...] = (
    FolderOutput("teacher_model", "kind train: the trained language model or ViT, a Hugging Face model directory"),
    FolderOutput("distilled_hf", "transformer: the compressed network, a Hugging Face model directory"),
    FolderOutput("searched_hf", "transformer search: the chosen language model, a Hugging Face model directory"),
    FolderOutput("finetuned_hf", "finetune of a transformer job: the trained network, a Hugging Face model directory"),
)


@dataclass(frozen=True)
class ChoiceFolder:
    """choices/<n>/: one choice made again from a search's candidate library (distill/choose.py)."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "choice.json"

    @property
    def architecture(self) -> Path:
        return self.root / "architecture.json"

    @property
    def searched_model(self) -> Path:
        return self.root / "searched_model.pt"

    @property
    def distilled_state(self) -> Path:
        return self.root / "distilled_state.pt"

    @property
    def searched_hf(self) -> Path:
        return self.root / "searched_hf"


@dataclass(frozen=True)
class CheckpointFolder:
    """checkpoints/ (or checkpoints/finetune/): `block-<i>/step-<s>.pt`, one folder per block (or stage)."""

    root: Path

    def __str__(self) -> str:
        return str(self.root)

    def block(self, block: int) -> Path:
        return self.root / f"block-{block}"

    def file(self, block: int, step: int) -> Path:
        return self.block(block) / f"step-{step:09d}.pt"

    def files(self, block: int) -> list[Path]:
        """Every checkpoint file of `block`, oldest step first."""
        return sorted(self.block(block).glob("step-*.pt"))

    @staticmethod
    def step_of(path: Path) -> int:
        """The step a checkpoint file (`step-<s>.pt`) was saved after."""
        return int(path.stem.split("-")[1])

    def saved_steps(self, block: int) -> list[int]:
        """The steps `block` has a checkpoint after, oldest first."""
        return sorted(self.step_of(path) for path in self.files(block))

    def resume_steps(self, num_blocks: int, common: bool) -> list[int]:
        """The step each block resumes from (0 = from scratch); `common` forces one step for all blocks (a
        pipelined resume: every block at the same step)."""
        per_block = [self.saved_steps(block) for block in range(num_blocks)]
        if not common:
            return [steps[-1] if steps else 0 for steps in per_block]
        shared = set(per_block[0]).intersection(*per_block[1:]) if per_block else set()
        return [max(shared, default=0)] * num_blocks


@dataclass(frozen=True)
class RunDir:
    root: Path

    def output(self, name: str) -> Path:
        """The path of documented output `name` (see OUTPUTS)."""
        if name not in {output.name for output in OUTPUTS}:
            raise KeyError(f"{name!r} is not a run-directory output; outputs: {', '.join(o.name for o in OUTPUTS)}")
        return self.root / name

    def folder_output(self, name: str) -> Path:
        """The path of documented folder output `name` (see FOLDER_OUTPUTS)."""
        if name not in {folder.name for folder in FOLDER_OUTPUTS}:
            names = ", ".join(folder.name for folder in FOLDER_OUTPUTS)
            raise KeyError(f"{name!r} is not a run-directory folder output; folder outputs: {names}")
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
    def distilled_state(self) -> Path:
        return self.output("distilled_state.pt")

    @property
    def distilled_export(self) -> Path:
        return self.output("distilled_model.pt2")

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
    def teacher_model(self) -> Path:
        """A Hugging Face model directory; the service offers it as one archive (FOLDER_OUTPUTS)."""
        return self.folder_output("teacher_model")

    @property
    def choices(self) -> Path:
        """The choices made again from a search's candidate library, one numbered folder each."""
        return self.root / "choices"

    def choice(self, index: int) -> ChoiceFolder:
        return ChoiceFolder(self.choices / str(index))

    @property
    def distilled_hf(self) -> Path:
        """A language model's compression as a Hugging Face model directory (a download: FOLDER_OUTPUTS)."""
        return self.folder_output("distilled_hf")

    @property
    def searched_hf(self) -> Path:
        """A language model's search as a Hugging Face model directory (a download: FOLDER_OUTPUTS)."""
        return self.folder_output("searched_hf")

    @property
    def finetuned_hf(self) -> Path:
        """A fine-tuned language model as a Hugging Face model directory (a download: FOLDER_OUTPUTS)."""
        return self.folder_output("finetuned_hf")

    @property
    def checkpoints(self) -> CheckpointFolder:
        return CheckpointFolder(self.root / "checkpoints")

    @property
    def finetune_checkpoints(self) -> CheckpointFolder:
        return CheckpointFolder(self.root / "checkpoints" / "finetune")

    @property
    def control(self) -> Path:
        """Requests to the running ranks (pipebd_core/distill/control.py)."""
        return self.root / "control"

    @property
    def stop_request(self) -> Path:
        return self.control / "stop.json"

    @property
    def stop_at(self) -> Path:
        return self.control / "stop_at.json"

    @property
    def stopped(self) -> Path:
        """Holds `rank-<r>` for every rank that stopped before its last task."""
        return self.control / "stopped"

    def stopped_marker(self, rank: int) -> Path:
        return self.stopped / f"rank-{rank}"

    def logs(self, phase: str = DISTILL) -> Path:
        return self.root / "logs" / phase

    def log(self, rank: int, phase: str = DISTILL) -> Path:
        return self.logs(phase) / f"rank-{rank}.log"

    def launcher_log(self, phase: str = DISTILL, node: int = 0) -> Path:
        """torchrun's output on node 0 (`launcher.log`), or on node `node` of a job on several nodes."""
        return self.logs(phase) / ("launcher.log" if node == 0 else f"launcher-node-{node}.log")

    @property
    def nodes(self) -> Path:
        """A job on several nodes: what the nodes tell each other (pipebd_core/job/nodes.py)."""
        return self.root / "nodes"

    def node_token(self, node: int) -> Path:
        """Written by node `node` at start: that it sees this run directory, under the job's run id."""
        return self.nodes / f"node-{node}.json"

    @property
    def rendezvous(self) -> Path:
        """Node 0's current launch: the phase, its torchrun rendezvous endpoint, or that the job is done."""
        return self.nodes / "rendezvous.json"

    def node_ended(self, node: int) -> Path:
        """How node `node`'s processes of the current launch ended."""
        return self.nodes / f"ended-{node}.json"

    def metrics(self, rank: int, phase: str = DISTILL) -> Path:
        return self.root / "metrics" / phase / f"rank-{rank}.jsonl"

    @property
    def tensorboard_root(self) -> Path:
        """TensorBoard event files, a folder (one TensorBoard run) per training phase."""
        return self.root / "tensorboard"

    def tensorboard(self, phase: str) -> Path:
        """The folder of training phase `phase`'s event files: one TensorBoard run (pipebd_core/tracking/)."""
        return self.tensorboard_root / phase

    def tensorboard_events(self, phase: str) -> Path:
        """The event file of training phase `phase` (TensorBoard reads any name with `tfevents` in it)."""
        return self.tensorboard(phase) / "events.out.tfevents.pipebd"

    def errors(self, phase: str = DISTILL) -> Path:
        return self.root / "errors" / phase

    def error(self, rank: int, phase: str = DISTILL) -> Path:
        return self.errors(phase) / f"rank-{rank}.json"

    def phase_outputs(self, phase: str) -> list[str]:
        """What `phase` writes, relative to the run directory (folders end with /)."""
        training = {DISTILL: self.checkpoints.root, FINETUNE: self.finetune_checkpoints.root}
        files = {
            PROFILE: [self.profile],
            PLAN: [self.plan],
            FINALIZE: [
                *(self.student, self.compressed_model, self.architecture, self.searched_model),
                *(self.distilled_state, self.distilled_export, self.summary),
            ],
            PROFILE_FINETUNE: [self.layer_profile],
            PLAN_FINETUNE: [self.finetune_plan],
            EVALUATE: [self.finetuned_model, self.exported_model, self.teacher, self.summary],
        }
        if phase in training:
            folders = [training[phase], self.metrics(0, phase).parent, self.logs(phase), self.errors(phase)]
            folders.append(self.tensorboard(phase))
        elif phase in (PROFILE, PROFILE_FINETUNE):
            folders = [self.logs(phase), self.errors(phase)]
        else:  # the Hugging Face model directories
            hf = {FINALIZE: [self.distilled_hf, self.searched_hf], EVALUATE: [self.finetuned_hf, self.teacher_model]}
            folders = hf.get(phase, [])
        paths = [*files.get(phase, []), *folders]
        return [path.relative_to(self.root).as_posix() + ("/" if path in folders else "") for path in paths]

    def final_weights(self, last_phase: str) -> Path:
        """The weights the job's last phase writes last: the students (finalize) or the trained network
        (evaluate)."""
        return self.finetuned_model if last_phase == EVALUATE else self.student

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text())

    def load_spec(self) -> Spec:
        """The job's resolved spec (spec.json)."""
        from pipebd_core.spec import parse_spec

        return parse_spec(self.read_json(self.spec))

    def load_plan(self) -> PlanDocument:
        """The distillation plan (plan.json); DocumentError when another version of PipeBD wrote it."""
        return PlanDocument.from_json(self.read_json(self.plan))

    def load_finetune_plan(self) -> FinetunePlanDocument:
        """The finetune phase's plan (finetune_plan.json); DocumentError when another PipeBD wrote it."""
        return FinetunePlanDocument.from_json(self.read_json(self.finetune_plan))

    def load_phases(self) -> list[PhaseRecord]:
        """The job's phases in order (phases.json)."""
        return PhasesRecord.from_json(self.read_json(self.phases)).phases

    def save_phases(self, records: list[PhaseRecord]) -> None:
        self.write_json(self.phases, PhasesRecord(phases=records).to_json())

    def load_profile(self) -> Profile:
        """The block profile the plan was made from (profile.json); DocumentError for another format's."""
        return Profile.from_json(self.read_json(self.profile))

    def load_layer_profile(self) -> LayerProfile:
        """The layer profile of end-to-end training (layer_profile.json); DocumentError likewise."""
        return LayerProfile.from_json(self.read_json(self.layer_profile))

    def load_calibration(self) -> Calibration:
        """What training measured against the profile (calibration.json); DocumentError likewise."""
        return Calibration.from_json(self.read_json(self.calibration))

    def append_event(self, event: str, **fields: Any) -> None:
        """Append one lifecycle event to events.jsonl (one write of one line: time, event and its fields, so
        concurrent ranks do not interleave)."""
        record = {"time": time.time(), "event": event, **fields}
        with self.events.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")

    def read_events(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The events of events.jsonl, oldest first (with `limit`, the newest `limit`); a line still being
        written is left out."""
        if not self.events.is_file():
            return []
        with self.events.open(encoding="utf-8", errors="replace") as handle:
            lines = deque(handle, maxlen=limit)
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def write_json(self, path: Path, data: Any) -> None:
        """Write atomically: readers never see half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(data, indent=2, default=str))
        temporary.replace(path)

    def rank_errors(self, phase: str = DISTILL) -> list[RankError]:
        """Errors written by ranks of `phase` that raised, earliest first (the first is the root cause)."""
        errors = [RankError.from_json(self.read_json(path)) for path in sorted(self.errors(phase).glob("rank-*.json"))]
        return sorted(errors, key=lambda error: error.time)

    def write_rank_error(self, phase: str, error: RankError) -> None:
        self.write_json(self.error(error.rank, phase), error.to_json())

    def clear_errors(self, phase: str) -> None:
        """Forget the rank errors of an earlier attempt at `phase`."""
        for path in self.errors(phase).glob("rank-*.json"):
            path.unlink()

    def read_telemetry(self, rank: int, phase: str = DISTILL) -> list[TelemetryLine]:
        """Every telemetry line rank `rank` of `phase` wrote (metrics/<phase>/rank-<r>.jsonl), in order."""
        path = self.metrics(rank, phase)
        return [read_line(phase, text) for text in path.read_text().splitlines()] if path.exists() else []

    def load_summary(self) -> Summary:
        """What the job produced (summary.json); DocumentError when an earlier PipeBD wrote it."""
        return Summary.from_json(self.read_json(self.summary))

    def save_summary(self, summary: Summary) -> None:
        self.write_json(self.summary, summary.to_json())
