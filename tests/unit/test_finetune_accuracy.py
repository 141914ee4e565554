"""tier: pure logic, CPU

`pipebd bench --accuracy --phase finetune`: its candidates (every strategy on the spec's cut, every
pipelined strategy on each other partitioner's) planned from one layer profile, one arm per distinct run,
the chosen one what `auto` plans; its figures (MAPE, Kendall's tau, regret) against the arms' medians.
A real bench of it (the LayerPipe sample network) is on the benchmarks page; running one here would
take a minute of ranks.
"""

from __future__ import annotations

import pytest

from pipebd_core.bench.finetune import bench_spec
from pipebd_core.bench.finetune_accuracy import (
    accuracy_section,
    calibrated_step_s,
    calibrated_steps,
    listed,
    plan_candidates,
)
from pipebd_core.documents.bench_record import Arm
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.planning.finetune_calibration import calibrated_layer_profile, predicted_parts
from pipebd_core.planning.finetune_planner import resolve_train_plan
from pipebd_core.spec import Spec, parse_spec
from tests.fake_profiles import fake_layer_profile
from tests.helpers import pipebd_here
from tests.ranks.test_finetune import e2e_document
from tests.unit.bench_samples import measured_run

STEPS = 10


@pytest.fixture(scope="module")
def spec() -> Spec:
    return parse_spec(e2e_document("zb", 2))  # 11 layers; the spec's partitioner: pipedream


def profile() -> LayerProfile:
    return fake_layer_profile(layers=11, f=1.0, i=1.0, w=1.0, b=2.0).profile


def test_every_candidate_is_planned_once_and_auto_s_plan_is_the_chosen_one(spec: Spec) -> None:
    candidates, chosen = plan_candidates(spec, profile(), STEPS)
    names = [name for name, *_ in listed(spec)]
    assert names == [
        "ddp",
        "gpipe",
        "1f1b",
        "zb",
        *(f"{s}-{p}" for s in ("gpipe", "1f1b", "zb") for p in ("even", "layerpipe", "auto")),
    ]
    given = [name for candidate in candidates for name in (candidate.name, *candidate.also)]
    assert sorted(given) == sorted([*names, "auto"])  # every name once, auto's among them
    keys = [candidate.key() for candidate in candidates]
    assert len(set(keys)) == len(keys)  # one arm per distinct run
    auto = resolve_train_plan(bench_spec(spec, "auto", STEPS), None, profile())
    chosen_candidate = next(c for c in candidates if c.name == chosen)
    assert chosen_candidate.key() == (auto.strategy, tuple(auto.stages), tuple(auto.moved))
    assert "auto" in chosen_candidate.also
    for candidate in candidates:  # a pipeline's cut names every partitioner that cut it, the spec's for its own
        names = [name for name in (candidate.name, *candidate.also) if name != "auto"]
        cuts = {name.split("-", 1)[1] if "-" in name else "pipedream" for name in names}
        assert set(candidate.partitioners) == (cuts if candidate.plan.pipelined else set())
    for candidate in candidates:  # each prediction is its own plan phase's, from the one profile
        replanned = resolve_train_plan(
            bench_spec(spec, candidate.strategy, STEPS, candidate.partitioner), None, profile()
        )
        assert replanned.details is not None and replanned.details.predictions is not None
        assert candidate.predicted_step_s == replanned.details.predictions.predicted_step_s


def arm(name: str, measured: list[float], part_s: list[dict[str, float]] | None = None) -> Arm:
    runs = [
        measured_run(repeat, step, timed_steps=8, profile_hash="h", peak_mem=0, part_s=part_s)
        for repeat, step in enumerate(measured)
    ]
    return Arm(name=name, runs=runs)


def test_the_figures_compare_each_prediction_with_its_arms_median(spec: Spec) -> None:
    candidates, chosen = plan_candidates(spec, profile(), STEPS)
    predicted = {c.name: c.predicted_step_s for c in candidates}
    measured = {name: 1.25 * step if name != chosen else 2.0 * step for name, step in predicted.items()}
    arms = {name: arm(name, [0.9 * step, step, 1.3 * step]) for name, step in measured.items()}  # median: step
    accuracy = accuracy_section(candidates, arms, chosen, {})
    errors = [abs(predicted[n] - measured[n]) / measured[n] for n in predicted]
    assert accuracy.mape == pytest.approx(sum(errors) / len(errors))
    assert accuracy.chosen == chosen and accuracy.calibrated is None
    assert accuracy.chosen_regret == pytest.approx(measured[chosen] / min(measured.values()) - 1)
    assert [plan.measured_step_s for plan in accuracy.plans] == pytest.approx([measured[c.name] for c in candidates])
    assert {plan.source for plan in accuracy.plans} <= {"strategy", "partition"}


def test_accuracy_takes_no_modes_of_its_own() -> None:
    code, _, err = pipebd_here(
        "bench", "examples/layerpipe-sample.yaml", "--phase", "finetune", "--accuracy", "--modes", "zb"
    )
    assert code == 2 and "--accuracy chooses its own plans" in err and "every strategy on every partitioner" in err


def measured_as(candidate_plan, forward: list[float], backward: list[float]) -> list[dict[str, float]]:
    """Per rank, the parts a run of the plan would measure: its predicted F and backward times the factors."""
    predictions = candidate_plan.details.predictions
    predicted = predicted_parts(predictions.simulation, candidate_plan.nproc)
    return [
        {"F": part["F"] * f, "B": part["back"] * b, "I": 0.0, "W": 0.0, "optim": 0.0}
        for part, f, b in zip(predicted, forward, backward, strict=True)
    ]


def test_a_ranks_measured_parts_scale_the_layers_it_computed(spec: Spec) -> None:
    """A gpipe run whose rank 0 forwards took twice the prediction and rank 1 backwards three times: stage
    0's layers have twice their F, stage 1's three times their B, I and W, at both batches."""
    candidates, _ = plan_candidates(spec, profile(), STEPS)
    gpipe = next(c for c in candidates if c.name == "gpipe").plan
    calibrated = calibrated_layer_profile(profile(), gpipe, measured_as(gpipe, [2.0, 1.0], [1.0, 3.0]))
    (start, stop), (after, end) = gpipe.stages
    for index, (before, now) in enumerate(zip(profile().layers, calibrated.layers, strict=True)):
        forward, backward = (2.0, 1.0) if index < stop else (1.0, 3.0)
        for batch in ("microbatch", "shard"):
            old, new = getattr(before, batch), getattr(now, batch)
            assert new.F.median == pytest.approx(forward * old.F.median)
            assert [new.B.median, new.I.median, new.W.median] == pytest.approx(
                [backward * old.B.median, backward * old.I.median, backward * old.W.median]
            )
            assert new.optim == old.optim
    assert (start, end) == (0, len(profile().layers)) and after == stop


def test_a_calibration_from_ddps_run_predicts_every_other_plan(spec: Spec) -> None:
    """ddp measured 1.5 times its prediction on both ranks: every layer 1.5 times slower, so every plan
    (no sends, no optimiser in this profile) is predicted 1.5 times slower; the donor is the next arm."""
    candidates, chosen = plan_candidates(spec, profile(), STEPS)
    ddp = next(c for c in candidates if c.name == "ddp")
    slower = measured_as(ddp.plan, [1.5, 1.5], [1.5, 1.5])
    for candidate in candidates:
        again = calibrated_step_s(spec, candidate, calibrated_layer_profile(profile(), ddp.plan, slower), STEPS)
        assert again == pytest.approx(1.5 * candidate.predicted_step_s)
        assert calibrated_step_s(spec, candidate, profile(), STEPS) == pytest.approx(candidate.predicted_step_s)
    parts = {c.name: measured_as(c.plan, [1.0, 1.0], [1.0, 1.0]) for c in candidates}
    arms = {c.name: arm(c.name, [c.predicted_step_s], parts[c.name]) for c in candidates}
    calibrated = calibrated_steps(spec, candidates, arms, profile(), STEPS)
    names, stages = [c.name for c in candidates], {c.name: c.plan.stages for c in candidates}
    after = {name: names[index + 1 :] + names[:index] for index, name in enumerate(names)}
    assert {name: donor for name, (_, donor) in calibrated.items()} == {  # the next that ran other stages
        name: next(other for other in after[name] if stages[other] != stages[name]) for name in names
    }
    accuracy = accuracy_section(candidates, arms, chosen, calibrated)
    assert accuracy.calibrated is not None and accuracy.calibrated.mape == pytest.approx(0.0, abs=1e-9)
    unmeasured = {c.name: arm(c.name, [c.predicted_step_s]) for c in candidates}
    assert calibrated_steps(spec, candidates, unmeasured, profile(), STEPS) == {}
