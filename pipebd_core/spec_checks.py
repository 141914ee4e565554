"""The spec's cross-section checks: each names a field, why it does not fit the rest of the spec, and what
would. `parse_spec` (pipebd_core/spec.py) runs them after every section has parsed on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipebd_core.spec import FinetuneSpec, Spec


def workload_problems(spec: Spec) -> list[str]:
    """`field.path: reason` for each way the workload and the data set do not fit each other."""
    kind, dataset = spec.workload.kind, spec.data.dataset
    problems = []
    vision = spec.workload.vision_transformer
    if kind == "transformer" and not vision and dataset not in ("text", "custom"):
        problems.append(
            f"data.dataset: workload kind 'transformer' reads token ids; use 'text' (a folder of .txt/.md/.jsonl"
            f" files) or 'custom', not {dataset!r}"
        )
    if vision and dataset == "text":
        problems.append(
            "data.dataset: a vision transformer reads images; use digits, synthetic, cifar10, imagefolder or"
            " custom, not 'text'"
        )
    if kind == "train" and spec.workload.language_model and dataset not in ("text", "custom"):
        problems.append(
            f"data.dataset: a language model (workload.config) trains on token ids; use 'text', not {dataset!r}"
        )
    if dataset == "text" and not spec.workload.language_model and not vision:
        problems.append(
            f"data.dataset: 'text' yields token ids for kind 'transformer' (or kind 'train' with a language"
            f" model's config), not kind {kind!r}"
        )
    budget = spec.workload.budget
    if budget is not None and budget.latency is not None and not spec.schedule.profile:
        problems.append(
            "workload.budget.latency: the candidates' latency is measured by the profile phase on the job's"
            " device; set schedule.profile: true, or budget params or kv_cache instead"
        )
    tune = spec.finetune
    if kind == "transformer" and tune is not None and len(spec.workload.replacements) > 1 and tune.init == "scratch":
        problems.append(
            "finetune.init: 'scratch' of a transformer search is not supported (its chosen layers start from the"
            " teacher's weights); use init 'distilled'"
        )
    return problems


def finetune_problems(spec: Spec) -> list[str]:
    """`field.path: reason` for each way the finetune section does not fit the rest of the spec."""
    tune, kind, nproc = spec.finetune, spec.workload.kind, spec.schedule.world_size  # every rank of every node
    if tune is None and kind == "train":
        return ["finetune: workload kind 'train' trains the network in the finetune phase; add finetune: {}"]
    if tune is None:
        return []
    problems = []
    if tune.loss == "kd" and kind in ("train", "custom"):
        problems.append(f"finetune.loss: 'kd' needs a teacher network, which kind {kind!r} has not; use 'ce'")
    batch = tune.batch_size or spec.data.batch_size
    if tune.strategy != "ddp" and batch % tune.microbatches:
        problems.append(
            f"finetune.microbatches: a batch of {batch} does not split into {tune.microbatches} equal"
            f" micro-batches; use a divisor of {batch}, or change finetune.batch_size"
        )
    if tune.strategy in ("1f1b", "zb") and tune.microbatches < nproc:
        problems.append(
            f"finetune.microbatches: {tune.strategy} on {nproc} stages needs at least {nproc} micro-batches,"
            f" got {tune.microbatches}; use finetune.microbatches >= {nproc} or strategy 'gpipe'"
        )
    if tune.stages is not None and tune.strategy == "ddp":
        problems.append("finetune.stages: strategy 'ddp' keeps the whole network on every rank; remove stages")
    elif tune.stages is not None and len(tune.stages) != nproc:
        problems.append(
            f"finetune.stages: {len(tune.stages)} stages for {nproc} ranks; pipelines run one stage per rank,"
            f" so give {nproc} first layers, or null to let the planner cut"
        )
    if tune.strategy == "ddp" and batch < nproc:
        problems.append(f"finetune.batch_size: a batch of {batch} cannot be split over {nproc} ranks")
    return problems + partition_problems(tune, nproc)


def partition_problems(tune: FinetuneSpec, nproc: int) -> list[str]:
    """How finetune.stages, partitioner and moved disagree with each other or with nproc."""
    problems = []
    if tune.stages is not None and tune.partitioner != "pipedream":
        problems.append(
            f"finetune.stages: partitioner {tune.partitioner!r} cuts the stages itself"
            + (" and plans the moved shares" if tune.partitioner in ("layerpipe", "auto") else "")
            + "; remove stages, or remove partitioner to train the given cuts (with finetune.moved to move"
            " delta across them)"
        )
    if tune.moved is not None and tune.stages is None:
        problems.append(
            "finetune.moved: the shares belong to explicit stage cuts; give finetune.stages too, or use"
            " partitioner 'layerpipe' to plan cuts and shares"
        )
    elif tune.moved is not None and len(tune.moved) != nproc - 1:
        problems.append(
            f"finetune.moved: {len(tune.moved)} shares for {nproc} stages; give one per boundary"
            f" ({nproc - 1}), 0 where nothing moves"
        )
    return problems
