"""How far a measured profile can be trusted: the report planning/trust.py makes of a block profile (plan.json)
and of a layer profile (finetune_plan.json)."""

from __future__ import annotations

from pipebd_core.documents.calibration import CalibrationSource
from pipebd_core.documents.parts import Part


class NoisyMeasurement(Part):
    """A measurement whose trials still disagree after re-measuring."""

    what: str  # "block <i> <teacher|student|...>", "data loading"; "layer <i> <F|B|...>", "all-reduce of ..."
    block: int | None
    batch: int
    spread: float  # (p90 - p10) / median, to 3 places
    remeasured: int


class ProfileTrust(Part):
    """How far a profile can be trusted (pipebd_core.planning.trust): plan.json's and finetune_plan.json's
    `profile_trust`, `pipebd plan --json`'s."""

    trusted: bool  # no flags
    flags: list[str]  # noisy, busy, stale
    messages: list[str]  # one per flag, then what else is known (no conditions recorded, a calibration)
    noisy: list[NoisyMeasurement]  # widest first
    other_cpu_cores: float | None  # other processes' CPU use while it was measured (None: not recorded)
    age_s: float | None
    calibrated_from: CalibrationSource | None  # the run whose block times the costs carry
