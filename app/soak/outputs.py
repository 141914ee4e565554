"""The soak's check that faults change no result: which succeeded jobs it reruns undisturbed (`sample`: one per
kind, a job that was restarted, paused or resumed on its way first), and the comparison of a job's weight files
with its rerun's (`compare_runs`: every state dict at the top of the rerun's run directory, tensor by tensor,
within the suite's equivalence tolerance)."""

from __future__ import annotations

import pickle
import random
from collections.abc import Sequence
from pathlib import Path

import torch

from app.core.states import RUNNING, SUCCEEDED
from app.soak.history import JobStates
from app.soak.invariants import WEIGHT_ATOL, WEIGHT_RTOL


def disturbed(job: JobStates) -> bool:
    """Ran more than once: restarted after a fault, or paused (or cancelled) and resumed."""
    return sum(change.state == RUNNING for change in job.changes) > 1


def sample(jobs: Sequence[JobStates], kinds: dict[int, str], rng: random.Random) -> list[int]:
    """One succeeded job per kind, a disturbed one where the kind has one."""
    chosen = []
    for kind in sorted(set(kinds.values())):
        succeeded = [job for job in jobs if kinds.get(job.job_id) == kind and job.final == SUCCEEDED]
        preferred = [job for job in succeeded if disturbed(job)] or succeeded
        if preferred:
            chosen.append(rng.choice(sorted(preferred, key=lambda job: job.job_id)).job_id)
    return chosen


def compare_runs(run: Path, reference: Path) -> tuple[list[str], list[str]]:
    """The weight files compared, and "file:tensor: why" for each tensor outside the tolerance."""
    compared, differing = [], []
    for path in sorted(reference.glob("*.pt")):
        expected = _state_dict(path)
        if expected is None:
            continue
        compared.append(path.name)
        actual = _state_dict(run / path.name)
        if actual is None:
            differing.append(f"{path.name}: missing or not a state dict in the soak's run")
            continue
        differing += [f"{path.name}:{why}" for why in _differences(actual, expected)]
    return compared, differing


def _state_dict(path: Path) -> dict[str, torch.Tensor] | None:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError):
        return None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        return None
    return loaded


def _differences(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    found = [f"{key}: missing" for key in sorted(set(expected) - set(actual))]
    found += [f"{key}: not in the rerun" for key in sorted(set(actual) - set(expected))]
    for key in sorted(set(expected) & set(actual)):
        a, b = actual[key], expected[key]
        if a.shape != b.shape:
            found.append(f"{key}: shape {tuple(a.shape)} against {tuple(b.shape)}")
        elif not torch.allclose(a.double(), b.double(), rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, equal_nan=True):
            worst = float((a.double() - b.double()).abs().max())
            found.append(f"{key}: differs by up to {worst:.3g}")
    return found
