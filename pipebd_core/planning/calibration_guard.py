"""When a calibration may change a prediction: never beyond what the noise lets it claim.

A calibration is measured on one run and applied to another plan's prediction. It is evidence for that
plan only when (the callers choose so) it comes from a run of other stages than the plan's (a run of the
same stages is the plan measuring itself, not a prediction) with as many ranks computing at once. And
even then a calibration can mislead: factors measured where two ranks shared the cores one way do not
hold where they share them another way. So the guard: where the calibrated prediction of a plan differs
from the profile's own prediction of it by more than the noise tolerance, the profile's prediction
stands (the calibration is not applied to that plan); within the tolerance, the calibrated one is used.

The tolerance is the target a prediction is held to on this machine: max(5%, 1.25 x the noise floor),
the floor being how well one repeat of a run predicts another of the same run (bench/doubt.py measures
it from a bench's repeats; a job's re-plan, with no repeats, uses the 5%).
"""

from __future__ import annotations

TARGET_FLOOR = 0.05  # the MAPE a prediction aims at on a quiet machine
TARGET_FACTOR = 1.25  # on a noisy one, this many times the noise floor


def tolerance(floor: float | None) -> float:
    """max(5%, 1.25 x the noise floor); 5% where the floor was not measured."""
    return max(TARGET_FLOOR, TARGET_FACTOR * floor) if floor is not None else TARGET_FLOOR


def agrees(profile_s: float, calibrated_s: float, within: float) -> bool:
    """The calibrated prediction is within `within` (relative) of the profile's."""
    return abs(calibrated_s - profile_s) <= within * profile_s


def guarded(profile_s: float, calibrated_s: float | None, within: float) -> float:
    """The prediction to use: the calibrated one where it agrees with the profile's, else the profile's."""
    if calibrated_s is None or not agrees(profile_s, calibrated_s, within):
        return profile_s
    return calibrated_s
