"""The blocks' work one after another (Profile.chain_s, planning/distill_costmodel.py's chain_factors): a
training step runs the blocks in turn, each evicting the last from the caches, which a block timed in a loop
of its own does not see. A profile that measured the chain costs every block's teacher and student by the
chain over the blocks' sum at the nearest measured batch; a profile without it (GPU, or written before it)
and a calibrated one (whose factors training measured, the chain included) are costed as before; a profile
without it keeps the digest a benchmark record names it by.
Tier: pure logic (no profile is measured)."""

from __future__ import annotations

import pytest

from pipebd_core.documents.calibration import BlockCalibration, Calibration, CalibrationSource
from pipebd_core.documents.profile import Profile, Timing
from pipebd_core.planning.distill_costmodel import CostModel, chain_factors
from tests.fake_profiles import fake_profile


def plain() -> Profile:
    return fake_profile([1.0, 2.0], [3.0, 4.0], nproc=2, batch_size=10)  # batches 10 and 5: 10 s and 5 s summed


def with_chain(profile: Profile, **seconds: float) -> Profile:
    chain = {int(batch.removeprefix("b")): Timing(median=s, trials=5) for batch, s in seconds.items()}
    return profile.model_copy(update={"chain_s": chain})


def test_the_chain_over_the_blocks_sum_scales_every_block_at_the_nearest_measured_batch() -> None:
    profile = with_chain(plain(), b10=11.0, b5=6.0)
    assert chain_factors(profile) == pytest.approx({10: 1.1, 5: 1.2})
    model, before = CostModel(profile), CostModel(plain())
    assert model.teacher(1, 10) == pytest.approx(1.1 * before.teacher(1, 10))
    assert model.student(0, 5) == pytest.approx(1.2 * before.student(0, 5))
    assert model.student(0, 4) == pytest.approx(1.2 * before.student(0, 4))  # the nearest batch above it
    assert model.teacher(0, 20) == pytest.approx(1.1 * before.teacher(0, 20))  # above every measured: the largest


def test_a_profile_without_the_chain_or_calibrated_is_costed_as_before() -> None:
    calibration = Calibration(
        source=CalibrationSource(run="r", steps=[1, 2], at=0.0),
        blocks=[BlockCalibration(teacher=1.0, student=1.0)] * 2,
    )
    calibrated = with_chain(plain(), b10=20.0).calibrated(calibration)
    for profile in (plain(), calibrated):
        assert chain_factors(profile) == {}
        assert CostModel(profile).teacher(1, 10) == pytest.approx(2.0)


def test_a_profile_without_the_chain_keeps_its_digest_and_one_with_it_writes_it() -> None:
    profile = plain()
    assert "chain_s" not in profile.to_json()
    measured = with_chain(profile, b10=11.0)
    assert measured.to_json()["chain_s"] == {"10": {"median": 11.0, "spread": 0.0, "trials": 5, "remeasured": 0}}
    assert Profile.from_json(measured.to_json()) == measured and measured.digest() != profile.digest()
