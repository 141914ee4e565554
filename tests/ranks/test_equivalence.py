"""Every execution mode trains exactly the students a plain sequential loop trains.

Tier: 1-5 rank gloo runs on CPU through torchrun. The workload is BN-free, so replicated stages
must match full-batch training to float rounding. The batch (10) splits unevenly over 3 ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pipebd_core.documents.phases import DISTILL
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.workload import build_workload
from tests.helpers import assert_same_weights, checkpointed_students, load_students, plain_loop, tiny_spec


@pytest.fixture(scope="module")
def single_rank(finished_run: Callable[[Spec], RunDir]) -> dict[str, torch.Tensor]:
    return load_students(finished_run(tiny_spec()))


def test_single_rank_run_equals_the_plain_loop(single_rank: dict[str, torch.Tensor]) -> None:
    assert_same_weights(single_rank, plain_loop(tiny_spec()))


def test_training_changes_the_students(single_rank: dict[str, torch.Tensor]) -> None:
    initial = build_workload(tiny_spec()).student_blocks[0].state_dict()
    assert not torch.allclose(single_rank["blocks.0.0.weight"], initial["0.weight"])


# One rank differs between modes only in task order, checked without ranks in
# tests/unit/test_schedule.py (single_rank is tr_dpu's one-rank run). dp, ls and ir at 2 ranks run in
# test_equivalence_batchnorm.py, on BatchNorm students (weights and running statistics must match).
CASES: list[tuple[str, int, Any]] = [
    *[(mode, 3, None) for mode in ("dp", "ls", "ir")],
    # 3 ranks only: a middle stage both receives and relays, so 2-rank runs would prove nothing more
    *[(mode, 3, None) for mode in ("tr", "tr_dpu")],
    ("hybrid", 3, [{"start": 0, "stop": 1, "replicas": 1}, {"start": 1, "stop": 4, "replicas": 2}]),
    ("hybrid", 3, [{"start": 0, "stop": 2, "replicas": 2}, {"start": 2, "stop": 4, "replicas": 1}]),
    ("hybrid", 5, [{"start": 0, "stop": 2, "replicas": 2}, {"start": 2, "stop": 4, "replicas": 3}]),
]


@pytest.mark.parametrize(
    ("mode", "nproc", "stages"),
    CASES,
    ids=[f"{m}-{n}-{'x'.join(str(s['replicas']) for s in st or [])}" for m, n, st in CASES],
)
def test_mode_equals_single_rank(
    mode: str, nproc: int, stages: Any, single_rank: dict[str, torch.Tensor], finished_run: Callable[..., RunDir]
) -> None:
    """Each mode's run stops after distill and is read from its checkpoints (finalize's gathering is the
    single-rank run's, checked against the plain loop above)."""
    spec = tiny_spec(schedule={"mode": mode, "nproc": nproc, "stages": stages})
    assert_same_weights(checkpointed_students(finished_run(spec, until=DISTILL)), single_rank)
