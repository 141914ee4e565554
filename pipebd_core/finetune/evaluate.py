"""The `evaluate` phase: the trained network's top-1 next to where it started and to its teacher, its size,
and the trained network saved twice: its state_dict and a torch.export program that needs no PipeBD.

Run as one process, `python -m pipebd_core.finetune.evaluate --run-dir DIR`, after the finetune phase
succeeded. summary.json gains a `finetune` section: top-1 of the teacher, of the network before the
end-to-end training (the distilled student, the searched or the freshly initialised network) and after,
parameters and FLOPs per sample of teacher and student, and the wall time of every phase. A kind
`train` job also writes teacher.pt, the torchvision-format state_dict a later job's
`workload.teacher_weights` takes as it is, and, for a language model or a vision transformer, teacher_model/:
the same network as a Hugging Face model directory a transformer job's `workload.teacher` loads (a language
model's through hf_directory.py, a ViT's as ViTForImageClassification through vit_directory.py).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.data.datasets import build_dataset
from pipebd_core.documents.phases import EVALUATE
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.finetune.trained import load_trained
from pipebd_core.rank.metrics import perplexity, top1_accuracy
from pipebd_core.rank.network import build_network, finetune_view, parameters, teacher_network
from pipebd_core.rank.process import exit_now, phase_entry, pick_device
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.flops import count_flops


def size_of(model: nn.Module, sample: torch.Tensor) -> ModelSize:
    """Parameters and forward FLOPs per sample."""
    model.eval()
    with torch.no_grad():
        _, flops = count_flops(model, sample.unsqueeze(0))
    return ModelSize(params=parameters(model), flops=flops)


def export(model: nn.Module, sample: torch.Tensor, run_dir: RunDir) -> None:
    """finetuned_model.pt2: `torch.export.load(path).module()` runs it, at any batch size (a language
    model's also at any sequence length), without PipeBD's classes."""
    example = sample.unsqueeze(0).expand(2, *sample.shape).contiguous().cpu()  # a batch of 1 would be frozen in
    dims = {0: torch.export.Dim("batch", min=1)}
    if not sample.is_floating_point() and sample.dim() == 1:  # token ids: sequences of any length too
        dims[1] = torch.export.Dim("tokens", min=2)
    program = torch.export.export(model.cpu().eval(), (example,), dynamic_shapes=(dims,))
    torch.export.save(program, run_dir.exported_model)


def write_finetuned_directory(spec: Spec, model: nn.Module, run_dir: RunDir) -> None:
    """finetuned_hf/: the trained language model as a Hugging Face model directory, its layers named as
    the distillation named them (a search's by its architecture.json); a vision transformer's where it is a
    plain torchvision ViT."""
    from pipebd_core.documents.architecture import Architecture
    from pipebd_core.workloads.hf_directory import layer_names, write_model_directory

    searched = run_dir.architecture.exists() and len(spec.workload.replacements) > 1
    architecture = Architecture.from_json(run_dir.read_json(run_dir.architecture)) if searched else None
    if spec.workload.vision_transformer:  # where it is a plain torchvision ViT (vit_directory.py)
        from pipebd_core.workloads.vit_directory import vit_layer_names, write_vit_directory

        network = model.cpu().eval()
        write_vit_directory(spec, network, vit_layer_names(spec, network, architecture), run_dir.finetuned_hf)
        return
    write_model_directory(spec, model.cpu().eval(), layer_names(spec, architecture), run_dir.finetuned_hf)


def write_vit_teacher(spec: Spec, model: nn.Module, run_dir: RunDir) -> None:
    """teacher_model/: a trained torchvision VisionTransformer as a ViTForImageClassification directory, where
    transformers expresses it (one linear head: no `representation_size`); otherwise teacher.pt alone."""
    from pipebd_core.workloads.vision_transformer import split_vit
    from pipebd_core.workloads.vit_directory import write_vit_directory

    parts = split_vit(model.cpu().eval())
    network = nn.Sequential(nn.Sequential(parts.embedding, parts.layers[0]), *parts.layers[1:], parts.head)
    written = write_vit_directory(spec, network, ["keep"] * len(parts.layers), run_dir.teacher_model)
    if not written:
        print("pipebd: evaluate: no teacher_model/ (a head with representation_size has no transformers form)")


def phase_seconds(run_dir: RunDir) -> dict[str, float | None]:
    return {record.name: record.duration_s for record in run_dir.load_phases()}


def run_evaluate(run_dir: RunDir) -> FinetuneReport:
    spec = run_dir.load_spec()
    view = finetune_view(spec)
    plan = TrainPlan.from_document(run_dir.load_finetune_plan())
    device = pick_device(spec, 0)
    sample = build_dataset(view)[0][0]
    network = build_network(spec, run_dir)
    language = spec.workload.language_model
    quality = perplexity if language else top1_accuracy
    before = quality(network.model, view, device)
    load_trained(network, run_dir, plan, plan.steps.total)
    after = quality(network.model, view, device)
    report = FinetuneReport(
        strategy=plan.strategy,
        top1_before=None if language else before,
        top1_after=None if language else after,
        perplexity_before=before if language else None,
        perplexity_after=after if language else None,
        student=size_of(network.model, sample.to(device)),
    )
    teacher = teacher_network(spec)
    if teacher is not None:
        if language:
            report.teacher_perplexity = perplexity(teacher, view, device)
        else:
            report.teacher_top1 = top1_accuracy(teacher, view, device)
        report.teacher = size_of(teacher.to(device), sample.to(device))
    torch.save(network.model.state_dict(), run_dir.finetuned_model)
    if spec.workload.kind == "train":  # the same bytes: a second name, not a second copy of hundreds of MB
        run_dir.teacher.unlink(missing_ok=True)
        os.link(run_dir.finetuned_model, run_dir.teacher)
        report.teacher_top1, report.teacher = report.top1_after, report.student
        if language:  # also as a Hugging Face model directory, which a transformer job takes as its teacher
            from pipebd_core.workloads.transformer import save_language_model

            save_language_model(spec, network.model.state_dict(), run_dir.teacher_model)
            report.teacher_perplexity = report.perplexity_after
        elif spec.workload.vision_transformer:
            write_vit_teacher(spec, network.model, run_dir)
    export(network.model, sample, run_dir)
    if spec.workload.kind == "transformer":  # also for transformers (hf_directory.py, vit_directory.py)
        write_finetuned_directory(spec, network.model, run_dir)
    report.phase_s = phase_seconds(run_dir)
    summary = run_dir.load_summary() if run_dir.summary.exists() else Summary(name=spec.name)
    summary.finetune = report
    run_dir.save_summary(summary)
    run_dir.append_event(
        "artifacts_written", phase=EVALUATE, top1=report.top1_after, perplexity=report.perplexity_after
    )
    what = "perplexity" if language else "top-1"
    print(f"pipebd: evaluate: {what} {before} before, {after} after", flush=True)
    return report


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.finetune.evaluate", description="the evaluate phase")
    phase_entry(EVALUATE, parser, lambda run_dir, _: run_evaluate(run_dir), argv, own_log=False)


if __name__ == "__main__":
    main()
    exit_now()
