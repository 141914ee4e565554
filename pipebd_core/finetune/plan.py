"""The finetune phase's plan: what the planner decided and the ranks follow (finetune_plan.json).

A strategy (`ddp`: the whole network on every rank, the batch split over them; `gpipe`, `1f1b`, `zb`:
one pipeline stage of contiguous layers per rank, the batch split into equal micro-batches), the
stages' layer ranges, the channels of each boundary layer whose delta the next stage computes (moved.py),
every rank's action list (schedules.py), the steps and the sample stream, and the boundary shapes.
`details` keeps what is informational: the partition and its costs, the ranked strategies, predictions,
timelines. finetune_plan.json is pipebd_core/documents/finetune_plan.py's `FinetunePlanDocument`.

`finetune_view(spec)` is the spec as the finetune phase trains it: the finetune section's optimiser,
epochs and batch put where the data and step helpers of the engine read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from typing import TYPE_CHECKING

from pipebd_core.data.streams import StepPlan
from pipebd_core.documents.finetune_plan import FinetuneDetails, FinetunePlanDocument
from pipebd_core.finetune.schedules import Action

PIPELINED = ("gpipe", "1f1b", "zb")


@dataclass
class TrainPlan:
    strategy: str  # ddp | gpipe | 1f1b | zb (auto is resolved to one of them)
    nproc: int
    batch_size: int  # the global batch
    microbatches: int  # pipelines: equal parts of the batch; ddp: 1
    stages: list[tuple[int, int]]  # per rank, layers [start, stop); ddp: the whole network once
    steps: StepPlan
    shapes: list[list[int]]  # per-sample shape entering each layer, then the logits'
    layer_names: list[str]
    input_dtype: str = "float32"  # the data's, entering layer 0: int64 for token ids (a language model)
    actions: list[list[Action]] = field(default_factory=list)  # pipelines: per rank, in order
    # pipelines: per boundary s -> s+1, how many input channels of stage s's last layer have their delta
    # computed by stage s+1 (LayerPipe's moved share); empty: none anywhere
    moved: list[int] = field(default_factory=list)
    details: FinetuneDetails | None = None  # informational; set by the planner

    @property
    def pipelined(self) -> bool:
        return self.strategy in PIPELINED

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // self.microbatches

    def example_input(self, layer: int, rows: int, device: torch.device) -> torch.Tensor:
        """Zeros of the shape and dtype entering `layer` for `rows` samples (token ids are the data's)."""
        import torch  # here: the planner's documents are read where torch is not imported

        dtype = getattr(torch, self.input_dtype) if layer == 0 else torch.float32
        return torch.zeros((rows, *self.shapes[layer]), dtype=dtype, device=device)

    def stage_of(self, rank: int) -> tuple[int, int]:
        return self.stages[rank] if self.pipelined else self.stages[0]

    def moved_at(self, boundary: int) -> int:
        """Channels moved across boundary `boundary` (between stages `boundary` and `boundary + 1`)."""
        return self.moved[boundary] if self.pipelined and 0 <= boundary < len(self.moved) else 0

    def document(self) -> FinetunePlanDocument:
        """finetune_plan.json: this plan with its details."""
        return FinetunePlanDocument(
            strategy=self.strategy,
            nproc=self.nproc,
            batch_size=self.batch_size,
            microbatches=self.microbatches,
            stages=self.stages,
            steps=self.steps.counts(),
            shapes=self.shapes,
            layer_names=self.layer_names,
            input_dtype=self.input_dtype,
            actions=[[str(action) for action in actions] for actions in self.actions],
            moved=self.moved,
            details=self.details or FinetuneDetails(layer_flops=[], requested_strategy=self.strategy),
        )

    def to_json(self) -> dict[str, Any]:
        return self.document().to_json()

    @classmethod
    def from_document(cls, document: FinetunePlanDocument) -> TrainPlan:
        return cls(
            strategy=document.strategy,
            nproc=document.nproc,
            batch_size=document.batch_size,
            microbatches=document.microbatches,
            stages=list(document.stages),
            steps=StepPlan.from_counts(document.steps),
            shapes=document.shapes,
            layer_names=document.layer_names,
            input_dtype=document.input_dtype,
            actions=[[Action.parse(text) for text in actions] for actions in document.actions],
            moved=document.moved,
            details=document.details,
        )

    @classmethod
    def from_json(cls, data: Any) -> TrainPlan:
        """The plan of finetune_plan.json; DocumentError when another version of PipeBD wrote it."""
        return cls.from_document(FinetunePlanDocument.from_json(data))
