"""The one rule for stopping a running distillation to relaunch it: on a better plan (replan.py) or on a larger
gang (grow.py). The ranks stop at a step boundary and start again, which costs about as long as this launch took
to reach its first step (or PIPEBD_RELAUNCH_S); that pays only when the remaining steps save more."""

from __future__ import annotations


def relaunch_declined(
    remaining_steps: int, running_step_s: float, faster_step_s: float, relaunch_s: float
) -> str | None:
    """Why a relaunch onto a plan of `faster_step_s` a step does not pay, in words; None when what the remaining
    steps would save over the running `running_step_s` exceeds `relaunch_s`."""
    saved_s = remaining_steps * (running_step_s - faster_step_s)
    if saved_s > relaunch_s:
        return None
    saving = f"the remaining {remaining_steps} steps would save {saved_s:.1f} s"
    return f"{saving}, less than a relaunch ({relaunch_s:.1f} s)"
