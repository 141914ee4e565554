"""After training: gather every block's final weights into student.pt, assemble the compressed
network, report top-1 accuracies where the data set has labels, and write summary.json.

Rank 0 does this once every block's final checkpoint exists. It waits on files, not on a
collective, so a rank that finishes early (layerwise scheduling) never hits a process-group timeout;
if another rank dies, torchrun stops this one, and if the run directory goes silent with blocks
still missing, rank 0 fails rather than wait forever.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn

from pipebd_core import checkpoint
from pipebd_core.data import build_dataset, iterate_eval_batches
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads import Workload

POLL_SECONDS = 0.2
FINAL_WAIT_MIN_S = 300.0  # silence in the run directory before rank 0 gives up on a missing block
EVAL_BATCH = 64


class StudentBlocks(nn.Module):
    """The container whose state_dict is student.pt: keys `blocks.<i>.<param>`."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)


def wait_for_final_checkpoints(run_dir: RunDir, num_blocks: int, total_steps: int, stall_s: float) -> None:
    """Wait until every block's last checkpoint exists.

    The other ranks are still training while their telemetry or checkpoints change; if nothing in
    the run directory has changed for `stall_s` seconds, the blocks still missing will never come
    (their rank exited without them), and waiting longer would hang the job.
    """
    missing = set(range(num_blocks))
    last_activity = time.time()
    while True:
        missing = {b for b in missing if total_steps not in checkpoint.saved_steps(run_dir.checkpoints, b)}
        if not missing:
            return
        last_activity = max(last_activity, _newest_change(run_dir))
        if time.time() - last_activity > stall_s:
            raise RuntimeError(
                f"blocks {sorted(missing)} have no final checkpoint (step {total_steps}) and no rank has written"
                f" anything for {stall_s:.0f} s; the ranks that own them stopped without saving"
            )
        time.sleep(POLL_SECONDS)


def _newest_change(run_dir: RunDir) -> float:
    """The newest modification time of the ranks' telemetry and checkpoints."""
    times = [0.0]
    for folder in (run_dir.root / "metrics", run_dir.checkpoints):
        for path in folder.rglob("*") if folder.exists() else []:
            try:
                times.append(path.stat().st_mtime)
            except FileNotFoundError:  # a checkpoint pruned while we looked
                continue
    return max(times)


def load_final_students(run_dir: RunDir, workload: Workload, total_steps: int) -> tuple[list[nn.Module], list[Any]]:
    """The trained student blocks (on CPU, eval mode) and each block's last loss."""
    students, losses = [], []
    for block, student in enumerate(workload.student_blocks):
        state = checkpoint.load_block(run_dir.checkpoints, block, total_steps)
        student.load_state_dict(state["student"])
        students.append(student.cpu().eval())
        losses.append(state.get("loss"))
    return students, losses


@torch.no_grad()
def top1_accuracy(model: nn.Module, spec: Spec, device: torch.device) -> float | None:
    """Top-1 accuracy on the eval split, or None when the data set has no labels."""
    if spec.data.eval_samples == 0:
        return None
    dataset = build_dataset(spec, split="eval")
    model.to(device).eval()
    correct = seen = 0
    for inputs, labels in iterate_eval_batches(spec, dataset, EVAL_BATCH):
        if int(labels.min()) < 0:
            return None
        predictions = model(inputs.to(device)).argmax(dim=1).cpu()
        correct += int((predictions == labels).sum())
        seen += len(labels)
        if seen >= spec.data.eval_samples:
            break
    return correct / seen if seen else None


def accuracy_report(spec: Spec, workload: Workload, compressed: nn.Module, device: torch.device) -> dict[str, Any]:
    """Top-1 of the compressed network and of the teacher, where the data set has real labels."""
    if spec.data.dataset == "synthetic":
        return {"top1_note": "synthetic labels are random, so no accuracy is reported"}
    if device.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)  # every block is trained: the other ranks are idle
    report = {"student_top1": top1_accuracy(compressed, spec, device)}
    if workload.teacher_network is not None:
        report["teacher_top1"] = top1_accuracy(workload.teacher_network(), spec, device)
    return report


def finalize(run_dir: RunDir, spec: Spec, workload: Workload, total_steps: int, device: torch.device) -> dict[str, Any]:
    stall_s = max(FINAL_WAIT_MIN_S, 5 * spec.schedule.timeout_s)
    wait_for_final_checkpoints(run_dir, workload.num_blocks, total_steps, stall_s)
    students, losses = load_final_students(run_dir, workload, total_steps)
    torch.save(StudentBlocks(students).state_dict(), run_dir.student)
    summary: dict[str, Any] = {
        "name": spec.name,
        "mode": spec.schedule.mode,
        "nproc": spec.schedule.nproc,
        "steps_per_block": total_steps,
        "final_loss": {str(block): loss for block, loss in enumerate(losses)},
        "warnings": workload.warnings,
    }
    if workload.derive is not None:
        architecture, searched = workload.derive(students)
        run_dir.write_json(run_dir.architecture, architecture)
        torch.save(searched, run_dir.searched_model)
        summary["architecture"] = architecture["blocks"]
    if workload.assemble is not None:
        compressed = workload.assemble(students)
        torch.save(compressed, run_dir.compressed_model)
        summary.update(accuracy_report(spec, workload, compressed, device))
    run_dir.write_json(run_dir.summary, summary)
    return summary
