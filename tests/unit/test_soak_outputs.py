"""The soak's rerun check (app/soak/outputs.py): which succeeded jobs it reruns, and the comparison of two run
directories' weight files within the suite's tolerance, on real files."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from app.soak.history import JobStates, StateChange
from app.soak.outputs import compare_runs, sample


def states(job_id: int, *names: str) -> JobStates:
    return JobStates(job_id, [StateChange(float(i), name) for i, name in enumerate(names)])


def test_one_succeeded_job_per_kind_is_rerun_a_disturbed_one_first() -> None:
    jobs = [
        states(1, "queued", "running", "succeeded"),
        states(2, "queued", "running", "queued", "running", "succeeded"),  # restarted after a fault
        states(3, "queued", "running", "failed"),
        states(4, "queued", "running", "succeeded"),
        states(5, "queued", "cancelled"),
    ]
    kinds = {1: "custom", 2: "custom", 3: "nas", 4: "compression", 5: "finetune"}
    assert sample(jobs, kinds, random.Random(0)) == [4, 2]


def save(folder: Path, name: str, tensors: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(tensors, folder / name)


def test_weights_within_the_tolerance_are_equal_and_others_named(tmp_path: Path) -> None:
    weights = {"w": torch.linspace(-1, 1, 8), "n": torch.tensor(3)}
    save(tmp_path / "rerun", "student.pt", weights)
    (tmp_path / "rerun" / "notes.pt").write_bytes(b"not a state dict")  # skipped, not compared
    save(tmp_path / "same", "student.pt", {"w": weights["w"] * (1 + 1e-7), "n": torch.tensor(3)})
    assert compare_runs(tmp_path / "same", tmp_path / "rerun") == (["student.pt"], [])
    save(tmp_path / "moved", "student.pt", {"w": weights["w"] + 1e-3, "n": torch.tensor(3)})
    assert compare_runs(tmp_path / "moved", tmp_path / "rerun") == (
        ["student.pt"],
        ["student.pt:w: differs by up to 0.001"],
    )
    (tmp_path / "gone").mkdir()
    compared, differing = compare_runs(tmp_path / "gone", tmp_path / "rerun")
    assert compared == ["student.pt"] and differing == ["student.pt: missing or not a state dict in the soak's run"]
