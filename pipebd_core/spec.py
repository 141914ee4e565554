"""The job spec: the one document the CLI, the REST API and every rank share.

A spec is YAML or JSON, validated here with pydantic before any process starts.
Fields may be added over time, never renamed: the REST API stores specs as they came.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pipebd_core.spec_checks import finetune_problems, workload_problems

MODES = ("dp", "ls", "ir", "tr", "tr_dpu", "hybrid", "auto")
COMPRESSION_TEACHERS = ("vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn")
STRATEGIES = ("ddp", "gpipe", "1f1b", "zb", "auto")
PARTITIONERS = ("even", "pipedream", "layerpipe", "auto")  # how a pipeline's layers are cut into stages
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
TRANSFORMER_FAMILIES = ("llama", "qwen2", "mistral", "gpt2")  # Hugging Face model_type of a transformer teacher
VIT_TEACHERS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")  # torchvision vision transformers
VIT_FAMILY = "vision_transformer"  # workload.config's model_type of a random torchvision VisionTransformer
VIT_MODEL_TYPE = "vit"  # config.json's model_type of a transformers ViTForImageClassification directory teacher
TRAINED_NETWORKS = (*COMPRESSION_TEACHERS, "mobilenet_v2", *VIT_TEACHERS)  # kind train: torchvision classifiers
# transformer replacements of a decoder layer (docs/transformers.md): the layer kept, its FFN narrowed to a
# fraction, its KV heads mean-pooled to a count, linear attention, its attention removed, a linear map, nothing
REPLACEMENT_PATTERN = re.compile(
    r"^(keep|linear_attention|no_attention|linear|noop|ffn_[1-9]\d*/[1-9]\d*|kv_[1-9]\d*)$"
)

Mode = Literal["dp", "ls", "ir", "tr", "tr_dpu", "hybrid", "auto"]


class SpecError(ValueError):
    """A spec that cannot be run; the message names the field path and what would work."""


def is_vit_directory(folder: str) -> bool:
    """Whether `folder` is a model directory whose config.json has `model_type: vit` (transformers' ViT): a
    vision transformer teacher (workloads/vit_teacher.py). Anything unreadable is not one (the language model
    path then says what is wrong with it)."""
    try:
        config = json.loads((Path(folder).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == VIT_MODEL_TYPE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_factory(value: str | None) -> str | None:
    if value is not None and not FACTORY_PATTERN.match(value):
        raise ValueError(f"must look like 'package.module:function', got {value!r}")
    return value


def _not_a_fraction(name: str) -> bool:
    """ffn_P/Q that does not narrow the FFN (P/Q of 1 or more)."""
    if not name.startswith("ffn_"):
        return False
    top, bottom = name.removeprefix("ffn_").split("/")
    return int(top) >= int(bottom)


def _a_transformer_search(info: ValidationInfo) -> bool:
    """Whether the workload fields validated so far make a transformer search (two candidates or more)."""
    return info.data.get("kind") == "transformer" and len(info.data.get("replacements") or []) >= 2


class Budget(_Strict):
    """A budgeted search's bounds, fractions of the teacher's layers: their parameters, their KV-cache bytes
    per token (linear attention and attention-free candidates keep none that grows with the sequence), their
    forward latency as the profile phase measures it on the job's device (at the global batch)."""

    params: float | None = Field(default=None, gt=0, le=1)
    kv_cache: float | None = Field(default=None, ge=0, le=1)
    latency: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _bounds_something(self) -> Budget:
        if self.params is None and self.kv_cache is None and self.latency is None:
            raise ValueError(
                "give params, kv_cache, latency or several, each a fraction of the teacher's, e.g. {params: 0.5}"
            )
        return self

    def fractions(self) -> dict[str, float]:
        """The bounds given, by cost name."""
        return self.model_dump(exclude_none=True)


class WorkloadSpec(_Strict):
    # compression and nas distil students; custom distils a factory's blocks; train trains `teacher` itself
    # (or, with `config`, a causal language model of that Hugging Face config, from scratch on text)
    # transformer distils a Hugging Face decoder model, or a torchvision vision transformer, layer by layer
    kind: Literal["compression", "nas", "custom", "train", "transformer"] = "compression"
    # compression: a torchvision VGG (default vgg16); nas: mobilenet_v2; train: what to train;
    # transformer: a local Hugging Face model directory (config.json and safetensors), a torchvision vision
    # transformer (VIT_TEACHERS), or "" with `config`
    teacher: str = ""
    teacher_weights: str | None = None  # torchvision-format state_dict; None = random init (warned)
    granularity: Literal["layer", "stage"] = "layer"  # compression: a block per conv, or per pooling stage
    # custom: "pkg.mod:fn" -> (teacher_blocks, student_blocks); train: "pkg.mod:fn" -> the network to train
    factory: str | None = Field(None, validate_default=True)
    options: dict[str, Any] = Field(default_factory=dict)  # keyword arguments for the factory
    # nas only: a ProxylessNAS-style supernet searched block by block against a MobileNetV2 teacher
    layers_per_block: list[int] = Field(default_factory=lambda: [2, 4, 4, 4, 4, 1])  # searchable layers
    gates: Literal["binary", "softmax"] = "binary"  # binary: one sampled path per step; softmax: mixture
    arch_lr: float = Field(1e-3, gt=0)  # Adam learning rate of the architecture parameters
    arch_update_every: int = Field(5, ge=1)  # weight steps between architecture updates
    arch_warmup: float = Field(0.25, ge=0, lt=1)  # fraction of the training before the first arch update
    arch_holdout: float = Field(0.1, gt=0, lt=1)  # fraction of the data held out for architecture batches
    width_mult: float = Field(1.0, gt=0)  # MobileNetV2 width multiplier (teacher and supernet)
    student_norm: Literal["batch", "none"] = "batch"  # batch: BatchNorm in every candidate; none: BN-free
    final_loss: Literal["ce", "mse"] = "ce"  # last block: cross-entropy to the teacher's softmax, or MSE
    # transformer only: a Hugging Face config (model_type one of TRANSFORMER_FAMILIES) for a random teacher, or
    # {model_type: vision_transformer, patch_size, num_layers, num_heads, hidden_dim, mlp_dim}: torchvision's
    config: dict[str, Any] | None = Field(None, validate_default=True)
    # transformer only: the candidates of every layer; one is compression, several a search (docs/transformers.md)
    replacements: list[str] = Field(default_factory=lambda: ["ffn_1/2"])
    # transformer search only: the chosen network's cost as fractions of the teacher's decoder layers'
    # (docs/transformers.md#the-budgeted-search), e.g. {params: 0.5}
    budget: Budget | None = None
    # transformer search only: each candidate's measured quality loss, its held-out block loss against its
    # teacher layer's output, or logits_kl: the KL of the teacher's next-token distribution to the teacher's
    # with that one layer swapped for the candidate (Puzzle's replace-one-block score), on held-out tokens
    search_loss: Literal["block", "logits_kl"] = "block"

    @property
    def language_model(self) -> bool:
        """Whether the network is a causal language model (token ids in, next-token logits out): a transformer
        workload's, or the one kind train trains from a config."""
        return (self.kind == "transformer" or (self.kind == "train" and self.config is not None)) and not (
            self.vision_transformer
        )

    @property
    def vision_transformer(self) -> bool:
        """Whether the teacher (or, for kind train, the network trained) is a vision transformer (images in,
        class logits out): torchvision's by name or config, or a transformers ViT directory."""
        return self.kind in ("transformer", "train") and (
            self.teacher in VIT_TEACHERS
            or (self.config or {}).get("model_type") == VIT_FAMILY
            or (self.teacher_directory and is_vit_directory(self.teacher))
        )

    @property
    def teacher_directory(self) -> bool:
        """Whether `teacher` is a path to a model directory (a transformer job's teacher that no name stands for)."""
        return self.kind == "transformer" and bool(self.teacher) and self.teacher not in VIT_TEACHERS

    @model_validator(mode="before")
    @classmethod
    def _default_teacher(cls, data: Any) -> Any:
        if isinstance(data, dict) and (data.get("kind") == "transformer" or data.get("config") is not None):
            return data  # a model directory, or a config: no default
        if isinstance(data, dict) and data.get("teacher", "") == "":  # absent or "": a default; {} stays an error
            data = {**data, "teacher": "mobilenet_v2" if data.get("kind") == "nas" else "vgg16"}
        return data

    # Checks that depend on `kind` are field validators (kind is declared first, so it is in
    # `info.data`): the error then carries the path of the field to change, e.g. workload.factory.
    @field_validator("teacher")
    @classmethod
    def _teacher_fits_kind(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind == "compression" and value not in COMPRESSION_TEACHERS:
            raise ValueError(
                f"{value!r} is not supported for compression; use one of " + ", ".join(COMPRESSION_TEACHERS)
            )
        if kind == "nas" and value != "mobilenet_v2":
            raise ValueError(f"{value!r} is not supported for nas; use mobilenet_v2")
        if kind == "train" and value and value not in TRAINED_NETWORKS:
            raise ValueError(
                f"{value!r} cannot be trained here; use one of " + ", ".join(TRAINED_NETWORKS) + ", or a language"
                " model's config (config: {model_type: llama, ...})"
            )
        return value

    @field_validator("config")
    @classmethod
    def _config_fits_kind(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        kind, teacher = info.data.get("kind"), info.data.get("teacher")
        if kind == "train" and value is not None and teacher:
            raise ValueError(
                f"kind 'train' trains either a torchvision classifier (teacher: {teacher!r}) or a language model"
                " of a config; give one"
            )
        if kind not in ("transformer", "train"):
            if value is not None:
                raise ValueError(
                    f"config builds a transformer (kind 'transformer' distils it, 'train' trains it); kind {kind!r}"
                    " has none, remove it"
                )
            return value
        if bool(teacher) == (value is not None):
            raise ValueError(
                "a transformer teacher is either a model directory or a torchvision vision transformer (teacher:"
                " path or vit_b_16) or a random model of a family (config: {model_type: llama, ...}); give exactly"
                " one"
            )
        families = (*TRANSFORMER_FAMILIES, VIT_FAMILY)
        if value is not None and value.get("model_type") not in families:
            raise ValueError(
                f"model_type {value.get('model_type')!r} is not supported; use one of " + ", ".join(families)
            )
        vision = teacher in VIT_TEACHERS or (value or {}).get("model_type") == VIT_FAMILY
        if kind == "transformer" and info.data.get("teacher_weights") is not None and not vision:
            raise ValueError(
                "teacher_weights is a torchvision state_dict, for a vision transformer teacher; a Hugging Face"
                " teacher's weights are its model directory's safetensors (workload.teacher): remove teacher_weights"
            )
        return value

    @field_validator("replacements")
    @classmethod
    def _replacement_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not REPLACEMENT_PATTERN.match(name) or _not_a_fraction(name)]
        if not value or bad or len(set(value)) != len(value):
            raise ValueError(
                f"{value!r}: give distinct candidates, each keep, ffn_P/Q (a fraction below 1, e.g. ffn_1/2),"
                " kv_N (N KV heads), linear_attention, no_attention, linear or noop"
                + (f"; not understood: {', '.join(bad)}" if bad else "")
            )
        if value == ["noop"]:
            raise ValueError("['noop'] alone leaves nothing to train; add a candidate with weights, e.g. ffn_1/2")
        return value

    @field_validator("budget")
    @classmethod
    def _budget_needs_a_search(cls, value: Budget | None, info: ValidationInfo) -> Budget | None:
        if value is None:
            return value
        if not _a_transformer_search(info):
            raise ValueError(
                "a budget chooses among a transformer search's candidates; give kind transformer and at least"
                " two replacements (e.g. [keep, ffn_1/2, no_attention]), or remove the budget"
            )
        return value

    @field_validator("search_loss")
    @classmethod
    def _search_loss_needs_a_search(cls, value: str, info: ValidationInfo) -> str:
        if value != "block" and not _a_transformer_search(info):
            raise ValueError(
                f"{value!r} measures a transformer search's candidates; give kind transformer and at least two"
                " replacements, or remove search_loss"
            )
        return value

    @field_validator("factory")
    @classmethod
    def _factory_fits_kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") == "custom" and not value:
            raise ValueError("kind 'custom' needs factory: 'package.module:function'")
        return _check_factory(value)

    @field_validator("layers_per_block")
    @classmethod
    def _layer_counts(cls, value: list[int], info: ValidationInfo) -> list[int]:
        if info.data.get("kind") == "nas" and (not value or min(value) < 1):
            raise ValueError("needs one count of at least 1 per block, e.g. [2, 4, 4, 4, 4, 1]")
        return value


class DataSpec(_Strict):
    # digits: scikit-learn's 1,797 handwritten 8x8 digits (shipped with the package), resized, 3 channels
    # text: token sequences from a folder of .txt, .md and .jsonl files (the transformer workload)
    dataset: Literal["synthetic", "digits", "cifar10", "imagefolder", "custom", "text"] = "synthetic"
    # cifar10: CIFAR10's folder; imagefolder: the tree; text: the folder of .txt/.md/.jsonl files
    root: str | None = Field(None, validate_default=True)
    factory: str | None = Field(None, validate_default=True)  # custom: "pkg.mod:fn" returning a torch Dataset
    options: dict[str, Any] = Field(default_factory=dict)  # keyword arguments for the factory
    image_size: int = Field(32, ge=8, le=1024)  # inputs are resized to image_size x image_size
    num_samples: int = Field(2048, ge=1)  # synthetic only; deterministic from train.seed
    num_classes: int = Field(10, ge=1)  # synthetic labels and the teacher's classifier width
    batch_size: int = Field(64, ge=1)  # the global batch, whatever the mode
    shuffle: bool = True  # False: global batches are consecutive slices in index order
    num_workers: int = Field(0, ge=0)  # DataLoader worker processes per loading rank
    eval_samples: int = Field(512, ge=0)  # samples used for the top-1 report after training
    seq_len: int = Field(128, ge=2, le=65536)  # text: tokens per sequence (packed, documents joined)
    tokenizer: str | None = None  # text: a local Hugging Face tokenizer folder (tokenizer.json); None: bytes

    @field_validator("root")
    @classmethod
    def _root_fits_dataset(cls, value: str | None, info: ValidationInfo) -> str | None:
        dataset = info.data.get("dataset")
        if dataset in ("cifar10", "imagefolder", "text") and not value:
            raise ValueError(f"dataset {dataset!r} needs root: the folder it reads (nothing is downloaded)")
        return value

    @field_validator("factory")
    @classmethod
    def _factory_fits_dataset(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("dataset") == "custom" and not value:
            raise ValueError("dataset 'custom' needs factory: 'package.module:function'")
        return _check_factory(value)


class TrainSpec(_Strict):
    epochs: int = Field(1, ge=1)  # passes over the data set, per block
    max_steps: int | None = Field(None, ge=1)  # stop each block after this many optimiser steps
    lr: float = Field(0.05, gt=0)  # SGD learning rate at step 0
    momentum: float = Field(0.9, ge=0, lt=1)  # SGD momentum
    weight_decay: float = Field(5e-4, ge=0)  # SGD weight decay
    lr_schedule: Literal["cosine", "constant"] = "cosine"  # cosine decays to 0 over the total steps
    seed: int = 0  # seeds data order, synthetic data and every block's initialisation
    # a block's loss against its teacher's output: mse, nmse (per sample, over the teacher's energy) or
    # cosine (1 - cosine similarity per token); NAS's last block keeps workload.final_loss
    loss: Literal["mse", "nmse", "cosine"] = "mse"
    checkpoint_every: int | None = Field(None, ge=1)  # steps between checkpoints; None = once per epoch


class FinetuneSpec(_Strict):
    """End-to-end training of the whole network after distillation (or, for kind train, instead of it)."""

    epochs: int = Field(1, ge=1)  # passes over the training data
    max_steps: int | None = Field(None, ge=1)  # stop after this many optimiser steps
    lr: float = Field(1e-4, gt=0)  # SGD learning rate at step 0 (Pipe-BD fine-tunes at 1e-4; retraining 0.05-0.1)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    batch_size: int | None = Field(None, ge=1)  # the global batch; None: data.batch_size
    loss: Literal["ce", "kd"] = "ce"  # ce: to the labels; kd: alpha x CE + (1 - alpha) x T^2 x divergence to teacher
    alpha: float = Field(0.5, ge=0, le=1)  # kd: weight of the cross-entropy to the labels
    temperature: float = Field(4.0, gt=0)  # kd: softening of both distributions
    # kd: the divergence to the teacher, of the softened distributions p (teacher) and q (student): forward
    # KL(p || q), reverse KL(q || p), or jsd: the Jensen-Shannon mixture, KL to m = (p + q) / 2 from both, halved
    divergence: Literal["forward", "reverse", "jsd"] = "forward"
    microbatches: int = Field(4, ge=1)  # pipelined strategies split the batch into this many equal parts
    strategy: Literal["ddp", "gpipe", "1f1b", "zb", "auto"] = "auto"  # see docs/finetune.md's table of strategies
    stages: list[int] | None = None  # pipelines: the first layer of each stage, from 0; None: the planner cuts
    partitioner: Literal["even", "pipedream", "layerpipe", "auto"] = "pipedream"  # docs/finetune.md: Partitioners
    moved: list[float] | None = None  # with stages: per boundary, the share of its last layer's delta moved on
    init: Literal["distilled", "scratch"] = "distilled"  # nas: the distilled supernet weights or DNA's retraining
    eval_every: int = Field(1, ge=1)  # epochs between evaluations of top-1 on the eval split
    profile: bool = True  # measure every layer first (cached): strategies ranked and predicted in the plan

    @field_validator("stages")
    @classmethod
    def _stages_start_at_zero(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or value[0] != 0 or any(b <= a for a, b in itertools.pairwise(value))):
            raise ValueError(f"must start at layer 0 and increase, e.g. [0, 6, 14]; got {value}")
        return value

    @field_validator("moved")
    @classmethod
    def _shares(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not 0 <= share <= 1 for share in value):
            raise ValueError(f"shares are fractions of a layer's input gradient, from 0 to 1; got {value}")
        return value

    @field_validator("profile")
    @classmethod
    def _auto_profiles(cls, value: bool, info: ValidationInfo) -> bool:
        if info.data.get("strategy") == "auto" and not value:
            raise ValueError("strategy 'auto' plans from measured layer costs; set profile: true or pick a strategy")
        partitioner = info.data.get("partitioner")
        if partitioner in ("layerpipe", "auto") and not value:
            raise ValueError(
                f"partitioner {partitioner!r} plans from measured delta and weight-gradient times; set profile:"
                " true or use partitioner 'pipedream' or 'even'"
            )
        return value


class StageSpec(_Strict):
    start: int = Field(ge=0)  # first block of the stage
    stop: int = Field(ge=1)  # one past the last block
    replicas: int = Field(1, ge=1)  # ranks that split this stage's batch

    @model_validator(mode="after")
    def _non_empty(self) -> StageSpec:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        return self


def fit_replicas(stages: list[StageSpec], ranks: int) -> list[StageSpec]:
    """`stages` with the same cuts and replicas summing to `ranks` (at least one each): the stage with the most
    replicas gives one up first (the earliest of equals), the one with the fewest takes one first."""
    if ranks < len(stages):
        raise ValueError(f"{len(stages)} pinned stages need at least {len(stages)} ranks, not {ranks}")
    replicas = [stage.replicas for stage in stages]
    while sum(replicas) > ranks:
        replicas[replicas.index(max(replicas))] -= 1
    while sum(replicas) < ranks:
        replicas[replicas.index(min(replicas))] += 1
    return [stage.model_copy(update={"replicas": k}) for stage, k in zip(stages, replicas, strict=True)]


class ElasticSpec(_Strict):
    """How far a job on several nodes may shrink when it loses nodes (docs/multinode.md, "Elastic jobs")."""

    min_nodes: int = Field(1, ge=1, le=64)  # the fewest nodes it goes on with, re-planned, after losing some
    # the most it runs on (None: schedule.nodes); above `nodes`, a job running smaller is offered a larger gang
    max_nodes: int | None = Field(None, ge=1, le=64)


class ScheduleSpec(_Strict):
    mode: Mode = "tr_dpu"  # see docs/planning.md's table of modes
    nproc: int = Field(2, ge=1, le=1024)  # ranks per node: one per GPU, or CPU processes
    nodes: int = Field(1, ge=1, le=64)  # machines the job spans (docs/multinode.md): nodes x nproc ranks in all
    stages: list[StageSpec] | None = Field(None, validate_default=True)  # hybrid (optional for tr/tr_dpu)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA with NCCL when present, else CPU/gloo
    threads_per_rank: int = Field(1, ge=1)  # CPU threads per rank (more than 1 oversubscribes small hosts)
    timeout_s: float = Field(60.0, gt=0)  # process-group timeout: a stuck peer fails the job after this
    profile: bool = True  # measure blocks first (cached): plans from measured costs, predictions in plan.json
    replan: bool | None = None  # auto: re-plan mid-run when training measures another plan faster (default on)
    max_replans: int = Field(2, ge=0, le=10)  # re-plans per job at most (no oscillation)
    elastic: ElasticSpec | None = None  # None: a job that loses a node waits for a gang of `nodes` again

    @field_validator("stages")
    @classmethod
    def _stages_fit_mode(cls, value: list[StageSpec] | None, info: ValidationInfo) -> list[StageSpec] | None:
        mode = info.data.get("mode")
        if mode == "hybrid" and not value:
            raise ValueError("mode 'hybrid' needs stages: [{start: 0, stop: k, replicas: r}, ...]")
        if value and mode is not None and mode not in ("tr", "tr_dpu", "hybrid"):
            raise ValueError(f"stages apply to modes tr, tr_dpu and hybrid, not {mode!r}; remove them")
        return value

    @field_validator("profile")
    @classmethod
    def _auto_profiles(cls, value: bool, info: ValidationInfo) -> bool:
        if info.data.get("mode") == "auto" and not value:
            raise ValueError("mode 'auto' plans from measured costs; set profile: true or pick a mode")
        return value

    @field_validator("replan")
    @classmethod
    def _replan_needs_auto(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        mode = info.data.get("mode")
        if value and mode != "auto":
            raise ValueError(
                f"re-planning chooses another plan of the auto search, but mode {mode!r} is fixed by the spec;"
                " use mode 'auto', or remove replan"
            )
        return value

    @model_validator(mode="after")
    def _nodes_fit(self) -> ScheduleSpec:
        """Elastic bounds a job on several nodes can run within (docs/multinode.md)."""
        if self.elastic is not None:
            self._check_elastic(self.elastic)
        return self

    def _check_elastic(self, elastic: ElasticSpec) -> None:
        """Elastic bounds the job can run within: min_nodes <= nodes <= max_nodes, and enough ranks for pinned
        stages."""
        if elastic.min_nodes > self.nodes:
            raise ValueError(
                f"elastic.min_nodes: {elastic.min_nodes} is above schedule.nodes ({self.nodes}): a job cannot need"
                f" more nodes than it asks for; use min_nodes {self.nodes} or fewer"
            )
        if elastic.max_nodes is not None and elastic.max_nodes < self.nodes:  # min_nodes is at most nodes
            below_min = f" and elastic.min_nodes ({elastic.min_nodes})" if elastic.max_nodes < elastic.min_nodes else ""
            raise ValueError(
                f"elastic.max_nodes: {elastic.max_nodes} is below schedule.nodes ({self.nodes}){below_min}: a job"
                f" asks for `nodes` and may grow up to max_nodes; use max_nodes {self.nodes} or more, or leave it out"
            )
        if self.stages and elastic.min_nodes * self.nproc < len(self.stages):
            fewest = -(-len(self.stages) // self.nproc)
            raise ValueError(
                f"elastic.min_nodes: {elastic.min_nodes} node(s) x {self.nproc} rank(s) is fewer ranks than the"
                f" {len(self.stages)} stages pinned in schedule.stages (every stage needs a rank); use min_nodes"
                f" {fewest} or more, or leave the stages to the planner"
            )

    def on_nodes(self, nodes: int) -> ScheduleSpec:
        """This schedule on `nodes` nodes (an elastic job resumed on the nodes it has now): pinned stages keep
        their cuts and give up or take back replicas, largest first, so the ranks still fill them. An elastic
        job keeps its ceiling: `max_nodes` left out was the nodes it asked for, so it may grow back to them."""
        stages = None if self.stages is None else fit_replicas(self.stages, nodes * self.nproc)
        elastic = self.elastic
        if elastic is not None and elastic.max_nodes is None:
            elastic = elastic.model_copy(update={"max_nodes": self.nodes})
        return self.model_copy(update={"nodes": nodes, "stages": stages, "elastic": elastic})

    @property
    def world_size(self) -> int:
        """Ranks in all: `nproc` on each of `nodes` machines (what plans and the cost model count)."""
        return self.nodes * self.nproc

    @property
    def replans(self) -> bool:
        """Whether the job re-plans mid-run: `replan`, which defaults to on for auto (on one node or several: the
        same gang is launched again under the new plan, docs/multinode.md)."""
        return self.mode == "auto" if self.replan is None else self.replan


class Spec(_Strict):
    name: str = Field("job", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # used in run folder names
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    finetune: FinetuneSpec | None = None  # None: no end-to-end training after distillation
    priority: int = Field(0, ge=-1000, le=1000)  # the service's queue: higher first, first come first within one
    # automatic restarts from checkpoints after infrastructure faults; None: the server's PIPEBD_MAX_RESTARTS, 0: off
    max_restarts: int | None = Field(None, ge=0, le=100)


WORKLOAD_KINDS: tuple[str, ...] = typing.get_args(WorkloadSpec.model_fields["kind"].annotation)
BOUNDS = {"ge": "at least", "gt": "more than", "le": "at most", "lt": "less than"}


def section_model(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The spec's model at `loc` (a path of field names from the top), or None where it is no model."""
    model: type[BaseModel] = Spec
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = [arg for arg in (field.annotation, *typing.get_args(field.annotation)) if isinstance(arg, type)]
        models = [arg for arg in inner if issubclass(arg, BaseModel)]
        if not models:
            return None
        model = models[0]
    return model


def spec_message(item: Mapping[str, Any]) -> str | None:
    """A sentence for a spec's pydantic error where pydantic's own says less: a misspelled field with the
    field it probably meant, a bound with the value sent; None: pydantic's message is the one to give."""
    loc, kind = list(item["loc"]), item["type"]
    if kind == "extra_forbidden" and loc:
        model = section_model(loc[:-1])
        names = list(model.model_fields) if model is not None else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.75)  # 0.6 offers `train` for `extra`
        hint = f"did you mean `{close[0]}`? " if close else ""
        listed = f"the fields here: {', '.join(names)}" if names else "docs/spec.md lists every field"
        return f"not a field here; {hint}{listed}"
    bound = next((name for name in BOUNDS if name in (item.get("ctx") or {})), None)
    if bound is not None and kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        name = str(loc[-1]) if loc else "the value"
        return f"{name} must be {BOUNDS[bound]} {item['ctx'][bound]}; got {item.get('input')!r}"
    return None


def format_validation_error(error: ValidationError) -> str:
    """One line per problem: `field.path: reason (got value)`."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(spec)"
        friendly = spec_message(item)
        if friendly is not None:
            lines.append(f"{path}: {friendly}")
            continue
        message = item["msg"].removeprefix("Value error, ")
        got = "" if item["type"] in ("missing", "value_error") else f" (got {item.get('input')!r})"
        lines.append(f"{path}: {message}{got}")
    return "\n".join(lines)


def parse_spec(document: dict[str, Any]) -> Spec:
    """Validate a spec document; raise SpecError naming each bad field."""
    if not isinstance(document, dict):
        raise SpecError(f"a spec must be a mapping of sections, got {type(document).__name__}")
    try:
        spec = Spec.model_validate(document)
    except ValidationError as error:
        raise SpecError(format_validation_error(error)) from None
    problems = workload_problems(spec) + finetune_problems(spec)
    if problems:
        raise SpecError("\n".join(problems))
    return spec


def load_document(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON spec file into a plain dict."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}")
    text = path.read_text()
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {error}") from None
    if not isinstance(document, dict):
        raise SpecError(f"{path}: a spec must be a mapping of sections, got {type(document).__name__}")
    return document


def set_field(document: dict[str, Any], key: str, value: Any) -> None:
    """Set the field at dotted path `key` (`train.lr`) in a spec document, making missing sections; SpecError
    naming the part that is not a section."""
    node = document
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"{part!r} is not a section")
        node = child
    node[parts[-1]] = value


def apply_overrides(document: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; values are parsed as YAML."""
    result = json.loads(json.dumps(document))
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {override!r}: expected dotted.key=value, e.g. train.epochs=2")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as error:
            raise SpecError(f"--set {key}: value is not valid YAML: {error}") from None
        try:
            set_field(result, key, value)
        except SpecError as error:
            raise SpecError(f"--set {key}: {error}") from None
    return result


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Spec:
    """Read, override and validate a spec file."""
    return parse_spec(apply_overrides(load_document(path), overrides or []))
