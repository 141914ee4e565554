"""Statistics that carry their doubt: the noise floor (an arm's repeats predicting each other) against
its formula written out, the target it sets, and every figure's interval over the interleaved repeats:
speed-ups, MAPE, Kendall's tau, a regret inside the noise said as such."""

from __future__ import annotations

import pytest

from pipebd_core.bench.doubt import figure_doubt, noise_floor, speedup, target
from pipebd_core.bench.report import floor_line, versus
from pipebd_core.documents.bench_record import Arm
from tests.unit.bench_samples import measured_run


def arm(name: str, steps: list[float]) -> Arm:
    runs = [measured_run(repeat, step) for repeat, step in enumerate(steps)]
    return Arm(name=name, runs=runs)


def test_the_noise_floor_is_the_mape_of_each_arms_repeats_against_each_other() -> None:
    a, b, single = arm("a", [1.0, 1.1, 0.9]), arm("b", [2.0, 2.2]), arm("c", [5.0])
    by_hand = [  # every ordered pair (i, j), i != j, of one arm's repeats: |m_i - m_j| / m_j
        0.1 / 1.1, 0.1 / 0.9, 0.1 / 1.0, 0.2 / 0.9, 0.1 / 1.0, 0.2 / 1.1,  # a
        0.2 / 2.2, 0.2 / 2.0,  # b
    ]  # fmt: skip
    floor = noise_floor([a, b, single])
    assert floor == pytest.approx(sum(by_hand) / 8)
    assert target(floor) == pytest.approx(max(0.05, 1.25 * sum(by_hand) / 8))
    assert target(0.01) == 0.05 and target(None) == 0.05  # a quiet machine: 5%
    assert noise_floor([single]) is None and "not measured" in floor_line([single])
    assert f"{floor:.1%}" in floor_line([a, b])


def test_figures_are_medians_over_the_repeats_with_their_range() -> None:
    arms = {"x": arm("x", [1.0, 1.2, 1.02]), "y": arm("y", [2.0, 1.8, 2.6]), "z": arm("z", [1.05, 1.3, 1.0])}
    predicted = {"x": 1.0, "y": 2.0, "z": 1.5}
    doubt = figure_doubt(predicted, arms, chosen="z")
    mapes = [  # per repeat, over x, y, z
        (0 + 0 + 0.45 / 1.05) / 3,
        (0.2 / 1.2 + 0.2 / 1.8 + 0.2 / 1.3) / 3,
        (0.02 / 1.02 + 0.6 / 2.6 + 0.5 / 1.0) / 3,
    ]
    assert doubt.mape is not None and doubt.mape.count == 3
    assert (doubt.mape.value, doubt.mape.low, doubt.mape.high) == pytest.approx(
        (sorted(mapes)[1], min(mapes), max(mapes))
    )
    assert doubt.rank_correlation is not None and doubt.rank_correlation.high == pytest.approx(1.0)  # repeat 0
    assert doubt.rank_correlation.low == pytest.approx(1 / 3)  # repeat 2: z ran faster than x
    assert doubt.regret is not None and doubt.regret.low == 0.0 and doubt.regret.high == pytest.approx(0.1 / 1.2)
    assert not doubt.chosen_fastest and doubt.regret_in_noise  # z's [1.0, 1.3] overlaps x's [1.0, 1.2]
    apart = figure_doubt(predicted, {**arms, "z": arm("z", [1.5, 1.6, 1.55])}, chosen="z")
    assert not apart.regret_in_noise  # z's [1.5, 1.6] is clear of x's: a regret, not noise


def test_a_speed_up_carries_its_range_over_the_repeats() -> None:
    base, fast = arm("dp", [2.0, 2.2, 2.1]), arm("tr", [1.0, 1.0, 1.05])
    ratio = speedup(fast, base)
    assert ratio is not None and (ratio.low, ratio.value, ratio.high) == pytest.approx((2.0, 2.1 / 1.05, 2.2))
    assert versus(fast, base) == "2.00x (2.00-2.20)"
    assert versus(arm("ls", [1.9, 2.05, 2.3]), base) == "overlaps dp"  # not ranked
