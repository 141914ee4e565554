"""What users see when a job is refused before anything runs: a bad spec, a workload that cannot be
built, devices the node lacks, missing data, impossible plans. Each names the field and what would work,
exits 2 and leaves no run directory.

Tier: pure logic. `pipebd run` is called in this process (tests/helpers.py:pipebd_here); the refusals
happen before launch, so no process starts (tests/unit/conftest.py would fail the test if one did).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import pipebd_here, tiny_document, write_spec


def test_bad_spec_fails_before_launch_naming_the_field(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, tiny_document(data={"batch_size": -1}))
    code, _, stderr = pipebd_here("run", str(spec), "--out", str(tmp_path / "run"))
    assert code == 2
    assert "data.batch_size: batch_size must be at least 1; got -1" in stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"options": {"widht": 8}}, "workload.options: pipebd_core.workloads.tiny:make_blocks does not accept"),
        ({"options": {"in_channels": 4}}, "workload: student block 0 fails on an input of shape (3, 8, 8)"),
        ({"factory": "tests.helpers:mismatched_blocks"}, "workload: block 1: student output (4, 8, 8) differs"),
        ({"factory": "tests.helpers:no_such_factory"}, "workload.factory: module 'tests.helpers' has no callable"),
    ],
)
def test_a_workload_that_cannot_be_built_fails_before_launch(tmp_path: Path, workload: dict, message: str) -> None:
    spec = write_spec(tmp_path, tiny_document(workload=workload))
    code, _, stderr = pipebd_here("run", str(spec), "--out", str(tmp_path / "run"))
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr
    assert not (tmp_path / "run").exists()


def test_devices_the_node_lacks_are_refused_before_launch(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        overrides, message = [f"schedule.nproc={torch.cuda.device_count() + 1}"], "ranks need one GPU each"
    else:
        overrides, message = ["schedule.device=cuda"], "schedule.device: 'cuda' but CUDA is not available"
    spec = write_spec(tmp_path, tiny_document())
    args = [arg for override in overrides for arg in ("--set", override)]
    code, _, stderr = pipebd_here("run", str(spec), "--out", str(tmp_path / "run"), *args)
    assert code == 2, stderr
    assert message in stderr
    assert not (tmp_path / "run").exists()


def test_missing_dataset_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    spec = write_spec(tmp_path, tiny_document(data={"dataset": "cifar10", "root": str(missing)}))
    code, _, stderr = pipebd_here("run", str(spec), "--out", str(tmp_path / "run"))
    assert code == 2
    assert str(missing / "cifar-10-batches-py") in stderr and "Nothing is downloaded" in stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["schedule.mode=hybrid", "schedule.stages=[{start: 0, stop: 4, replicas: 3}]"], "make them sum to 2"),
        (["schedule.mode=tr", "schedule.nproc=5"], "use --nproc 4 or fewer"),
        (["schedule.mode=dp", "schedule.nproc=11"], "a batch of 10 rows cannot be split over 11 replicas"),
        (["data.batch_size=64"], "data.batch_size: 64 exceeds the data set size (40 samples)"),
    ],
)
def test_impossible_plans_say_what_would_work(tmp_path: Path, overrides: list[str], message: str) -> None:
    spec = write_spec(tmp_path, tiny_document(schedule={"nproc": 2}))
    args = [arg for override in overrides for arg in ("--set", override)]
    code, _, stderr = pipebd_here("run", str(spec), "--out", str(tmp_path / "run"), *args)
    assert code == 2, stderr
    assert message in stderr
    assert not (tmp_path / "run").exists()
