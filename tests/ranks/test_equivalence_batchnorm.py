"""Every mode trains exactly the BatchNorm students a plain full-batch loop trains.

Tier: 1-3 rank gloo runs on CPU through torchrun. The students are the compression workload's
depthwise-separable blocks (3x3 depthwise, BatchNorm, ReLU, 1x1 pointwise, BatchNorm, ReLU), here of
four small VGG-like conv stages (tests/bn_workload.py; VGG-11's classifier would only cost time). The
batch of 11 splits unevenly over 2 (6, 5) and 3 (4, 4, 3) ranks, so wherever rows are split the
cross-rank BatchNorm must combine shards of unequal size. student.pt holds the running statistics
and num_batches_tracked beside the weights, and every one of them must match. The NAS workload's
BatchNorm supernets are proven the same way in test_nas.py; that the assembled compressed network of a
run with split rows holds plain BatchNorm (a module holding a process group cannot be saved), in
test_examples.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pipebd_core.documents.phases import DISTILL
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.helpers import assert_same_weights, checkpointed_students, load_students, plain_loop

Students = dict[str, torch.Tensor]


def bn_spec(**schedule: Any) -> Spec:
    """4 conv stages with BatchNorm (tests/bn_workload.py: 12 student BatchNorm layers), 3 steps of 11
    synthetic 16x16 images."""
    return parse_spec(
        {
            "name": "bn-students",
            "workload": {"kind": "custom", "factory": "tests.bn_workload:make_bn_blocks"},
            "data": {"dataset": "synthetic", "image_size": 16, "num_samples": 33, "batch_size": 11},
            "train": {"epochs": 1, "lr": 0.05, "seed": 0},
            "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False, **schedule},
        }
    )


@pytest.fixture(scope="module")
def students_of(finished_run: Callable[..., RunDir]) -> Callable[[Spec], Students]:
    """The single-rank run's students as finalize gathered them; every other mode's run stops after
    distill and is read from its checkpoints (no finalize process to pay for)."""
    single = bn_spec()
    return lambda spec: (
        load_students(finished_run(spec))
        if spec == single
        else checkpointed_students(finished_run(spec, until=DISTILL))
    )


def test_single_rank_run_equals_the_plain_loop(students_of: Callable[[Spec], Students]) -> None:
    single = students_of(bn_spec())
    assert_same_weights(single, plain_loop(bn_spec()))
    assert int(single["blocks.0.0.1.num_batches_tracked"]) == 3  # the first DSConv's depthwise BatchNorm
    initial_variance = torch.ones_like(single["blocks.0.0.1.running_var"])
    assert not torch.allclose(single["blocks.0.0.1.running_var"], initial_variance)


CASES: list[tuple[str, int, Any]] = [
    ("dp", 3, None),  # 3 ranks: shards of unequal size, which 2 ranks of an even batch never make
    ("ir", 3, None),
    ("ls", 2, None),
    ("tr", 2, None),
    ("tr_dpu", 3, None),
    ("hybrid", 3, [{"start": 0, "stop": 2, "replicas": 2}, {"start": 2, "stop": 4, "replicas": 1}]),
]


@pytest.mark.parametrize(("mode", "nproc", "stages"), CASES, ids=[f"{m}-{n}" for m, n, _ in CASES])
def test_mode_equals_single_rank(mode: str, nproc: int, stages: Any, students_of: Callable[[Spec], Students]) -> None:
    spec = bn_spec(mode=mode, nproc=nproc, stages=stages)
    assert_same_weights(students_of(spec), students_of(bn_spec()))
