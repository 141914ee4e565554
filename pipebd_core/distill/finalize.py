"""The `finalize` phase: gather every block's final weights into student.pt, assemble the compressed
network (or derive the searched one), report top-1 accuracies where the data set has labels, and
write summary.json.

Run as one process, `python -m pipebd_core.distill.finalize --run-dir DIR`, after the `distill` phase
succeeded, so every block's final checkpoint is there; a missing one is an error that says which.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.distill.plan import Plan
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
from pipebd_core.documents.phases import FINALIZE
from pipebd_core.documents.summary import AccuracyReport, Summary
from pipebd_core.rank import checkpoint
from pipebd_core.rank.metrics import perplexity, top1_accuracy
from pipebd_core.rank.network import StudentBlocks
from pipebd_core.rank.process import exit_now, phase_entry, pick_device
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.workload import Workload, build_workload


def check_final_checkpoints(run_dir: RunDir, num_blocks: int, total_steps: int) -> None:
    """Every block's last checkpoint must exist: the distill phase writes it after the last step."""
    missing = [b for b in range(num_blocks) if total_steps not in run_dir.checkpoints.saved_steps(b)]
    if missing:
        raise RuntimeError(
            f"blocks {missing} have no final checkpoint (step {total_steps}) in {run_dir.checkpoints};"
            " the distill phase did not finish them: resume the run to train them"
        )


def load_final_students(run_dir: RunDir, workload: Workload, total_steps: int) -> tuple[list[nn.Module], list[Any]]:
    """The trained student blocks (on CPU, eval mode) and each block's last loss."""
    students, losses = [], []
    for block, student in enumerate(workload.student_blocks):
        state = checkpoint.load_block(run_dir.checkpoints, block, total_steps)
        student.load_state_dict(state["student"])
        students.append(student.cpu().eval())
        losses.append(state.get("loss"))
    return students, losses


def accuracy_report(spec: Spec, workload: Workload, compressed: nn.Module, device: torch.device) -> AccuracyReport:
    """Top-1 of the compressed network and of the teacher, where the data set has real labels, or their
    perplexity for a language model (the fields of the summary they fill in; a teacher's only with one)."""
    if spec.data.dataset == "synthetic":
        return AccuracyReport(top1_note="synthetic labels are random, so no accuracy is reported")
    if device.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)  # every block is trained: the other ranks are idle
    if spec.data.dataset == "text":
        from pipebd_core.workloads.transformer import network_costs  # a language model: transformers is there

        params, kv_bytes = network_costs(compressed)
        report = AccuracyReport(
            top1_note="a language model: held-out perplexity instead of top-1",
            student_perplexity=perplexity(compressed, spec, device),
            student_params=params,
            student_kv_cache_bytes=kv_bytes,
        )
        if workload.teacher_network is not None:
            teacher = workload.teacher_network()
            report.teacher_perplexity = perplexity(teacher, spec, device)
            report.teacher_params, report.teacher_kv_cache_bytes = network_costs(teacher)
        return report
    report = AccuracyReport(student_top1=top1_accuracy(compressed, spec, device))
    if workload.teacher_network is not None:
        report.teacher_top1 = top1_accuracy(workload.teacher_network(), spec, device)
    return report


def finalize(run_dir: RunDir, spec: Spec, workload: Workload, total_steps: int, device: torch.device) -> Summary:
    check_final_checkpoints(run_dir, workload.num_blocks, total_steps)
    students, losses = load_final_students(run_dir, workload, total_steps)
    torch.save(StudentBlocks(students).state_dict(), run_dir.student)
    blocks: list[ArchitectureBlock] | None = None  # a search's architecture
    accuracy: AccuracyReport | None = None  # of the compressed (or a transformer's searched) network
    distilled: nn.Module | None = None  # the searched or compressed network
    architecture: Architecture | None = None
    if workload.derive is not None:
        profile = run_dir.load_profile() if run_dir.profile.exists() else None  # a latency budget's costs
        architecture, searched = workload.derive(students, profile)
        distilled = searched
        run_dir.write_json(run_dir.architecture, architecture.to_json())
        torch.save(searched, run_dir.searched_model)
        blocks = architecture.blocks
        if spec.workload.kind == "transformer":  # the searched network's perplexity or top-1, beside its teacher's
            accuracy = accuracy_report(spec, workload, searched, device)
    if workload.assemble is not None:  # the same fields as a searched network's: the compressed one's replace them
        distilled = compressed = workload.assemble(students)
        torch.save(compressed, run_dir.compressed_model)
        accuracy = accuracy_report(spec, workload, compressed, device)
    if workload.export is not None and distilled is not None:  # a language model's state_dict and program
        torch.save(distilled.state_dict(), run_dir.distilled_state)
        workload.export(distilled, run_dir.distilled_export)
    if workload.hf_directory is not None and distilled is not None:  # a language model, for transformers
        folder = run_dir.searched_hf if architecture is not None else run_dir.distilled_hf
        workload.hf_directory(distilled, architecture, folder)
    summary = Summary(
        name=spec.name,
        mode=spec.schedule.mode,
        nproc=spec.schedule.world_size,
        steps_per_block=total_steps,
        final_loss=dict(enumerate(losses)),
        warnings=workload.warnings,
        **(accuracy.model_dump(exclude_unset=True) if accuracy is not None else {}),
    )
    if blocks is not None:  # assigned, so set: summary.json has the fields finalize set, and only those
        summary.architecture = blocks
    run_dir.save_summary(summary)
    return summary


def run_finalize(run_dir: RunDir) -> None:
    spec = run_dir.load_spec()
    plan = Plan.from_document(run_dir.load_plan())
    device = pick_device(spec, 0)
    summary = finalize(run_dir, spec, build_workload(spec), plan.step_plan.total, device)
    print(f"pipebd: finalize: wrote {', '.join(sorted(p.name for p in run_dir.root.glob('*.pt')))}", flush=True)
    run_dir.append_event("artifacts_written", final_loss=summary.to_json()["final_loss"])


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.distill.finalize", description="the finalize phase")
    phase_entry(FINALIZE, parser, lambda run_dir, _: run_finalize(run_dir), argv, own_log=False)


if __name__ == "__main__":
    main()
    exit_now()
