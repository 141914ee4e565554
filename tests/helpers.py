"""Shared test helpers: tiny specs and running a job through torchrun from inside the test process."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from pipebd_core import cli
from pipebd_core.data.batches import global_batch_indices, total_steps
from pipebd_core.data.datasets import build_dataset
from pipebd_core.distill.finalize import load_final_students
from pipebd_core.distill.plan import Plan
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.finetune.trained import load_trained
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.outcomes import SUCCEEDED
from pipebd_core.job.supervisor import Supervisor
from pipebd_core.rank.network import StudentBlocks, build_network
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from pipebd_core.workloads.losses import LOSSES, block_loss
from pipebd_core.workloads.tiny import make_blocks
from pipebd_core.workloads.workload import build_workload

RUN_TIMEOUT_S = 180
ROOT = Path(__file__).resolve().parents[1]  # the repository


def tiny_document(**sections: dict[str, Any]) -> dict[str, Any]:
    """A BN-free custom workload small enough to run any mode in seconds; batches split unevenly."""
    document: dict[str, Any] = {
        "name": "tiny",
        "workload": {"kind": "custom", "factory": "pipebd_core.workloads.tiny:make_blocks", "options": {}},
        "data": {"dataset": "synthetic", "image_size": 8, "num_samples": 40, "batch_size": 10},
        "train": {"epochs": 2, "lr": 0.05, "seed": 3},
        "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},  # FLOP-balanced stages: no profiling job
    }
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return document


def mismatched_blocks() -> tuple[list[nn.Module], list[nn.Module]]:
    """A factory whose second student does not reproduce its teacher's output shape (a user's mistake)."""
    teachers, students = make_blocks(num_blocks=2)
    students[1] = nn.Conv2d(8, 4, 1)
    return teachers, students


def pipebd(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipebd_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def write_spec(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(document))
    return path


def pipebd_here(*args: str) -> tuple[int, str, str]:
    """`pipebd ARGS` run in this process, for commands refused before anything starts (no interpreter and
    no torch import to pay for each): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exit:  # argparse's refusals
            code = exit.code if isinstance(exit.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def tiny_spec(**sections: dict[str, Any]) -> Spec:
    return parse_spec(tiny_document(**sections))


def run_job(spec: Spec, out: Path, env: dict[str, str] | None = None, until: str | None = None) -> tuple[int, RunDir]:
    """Prepare and run every phase (up to `until`) under the supervisor (bounded); 0 when the job
    succeeded, else 1."""
    run_dir = prepare_run(spec, out)
    outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S, extra_env=env, until=until).run()
    return (0 if outcome.result == SUCCEEDED else 1), run_dir


def load_students(run_dir: RunDir) -> dict[str, torch.Tensor]:
    """The students finalize gathered (student.pt)."""
    return torch.load(run_dir.student, map_location="cpu", weights_only=True)


def checkpointed_students(run_dir: RunDir) -> dict[str, torch.Tensor]:
    """The students as the distill phase left them, read from each block's last checkpoint, under
    student.pt's keys: what a run stopped after distill (`until=DISTILL`) trained, without a finalize
    process (its torch import costs a tiny run a third of its time)."""
    total = Plan.from_document(run_dir.load_plan()).step_plan.total
    students, _ = load_final_students(run_dir, build_workload(run_dir.load_spec()), total)  # finalize's own gathering
    return StudentBlocks(students).state_dict()


def checkpointed_finetune(run_dir: RunDir) -> dict[str, torch.Tensor]:
    """The network as the finetune phase's last checkpoints hold it, loaded as the evaluate phase loads it
    before saving finetuned_model.pt: what a run stopped after finetune (`until=FINETUNE`) trained, without
    an evaluate process."""
    plan = TrainPlan.from_document(run_dir.load_finetune_plan())
    network = build_network(run_dir.load_spec(), run_dir)
    load_trained(network, run_dir, plan, plan.steps.total)
    return network.model.state_dict()


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float = 1e-5) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=rtol, atol=1e-7, msg=f"parameter {key} differs")


def plain_loop(spec: Spec) -> dict[str, torch.Tensor]:
    """Blockwise distillation written out sequentially: the definition every mode must meet (a student of
    several candidates trains each against the same target: block_loss sums their losses)."""
    workload = build_workload(spec)
    dataset = build_dataset(spec)
    steps = total_steps(spec, len(dataset))
    optimizers = [
        torch.optim.SGD(
            [p for p in s.parameters() if p.requires_grad],
            lr=spec.train.lr,
            momentum=spec.train.momentum,
            weight_decay=spec.train.weight_decay,
        )
        for s in workload.student_blocks
    ]
    for step in range(steps):
        lr = spec.train.lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        x = torch.stack([dataset[i][0] for i in global_batch_indices(spec, len(dataset), step)])
        for block, (teacher, student, optimizer) in enumerate(
            zip(workload.teacher_blocks, workload.student_blocks, optimizers, strict=True)
        ):
            with torch.no_grad():
                target = teacher(x)
            optimizer.zero_grad()
            block_loss(student, LOSSES[workload.loss_of(block)], x, target).backward()
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            x = target
    return {f"blocks.{i}.{k}": v for i, s in enumerate(workload.student_blocks) for k, v in s.state_dict().items()}


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Every process whose command line mentions `text` (a run directory: its agent and forked ranks)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def end_to_end_training(
    spec: Spec, network: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The finetune phase written out: `network`'s trainable weights, full global batches of the phase's
    data in order, SGD with its cosine schedule, `loss(inputs, outputs, labels)` per step."""
    from pipebd_core.rank.network import finetune_view

    view = finetune_view(spec)
    train = view.train
    trainable = [p for p in network.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    dataset = build_dataset(view)
    steps = total_steps(view, len(dataset))
    for step in range(steps):
        batch = [dataset[i] for i in global_batch_indices(view, len(dataset), step)]
        inputs, labels = torch.stack([x for x, _ in batch]), torch.stack([torch.as_tensor(y) for _, y in batch])
        for group in optimizer.param_groups:
            group["lr"] = train.lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        optimizer.zero_grad()
        loss(inputs, network(inputs), labels).backward()
        optimizer.step()
    return network.state_dict()
