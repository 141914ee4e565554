"""tier: pure logic, CPU

The benchmarks page's generated judgements of accuracy records: the partitions table (every partitioner's
cut per pipelined strategy, the planner's pick against the best measured cut), the sentences that say
where a target is missed and why, and the accuracy table a phase (development or held-out). Fixtures of
plans and runs; the real records are on the page (tests/unit/test_benchmarks_page.py)."""

from __future__ import annotations

import json
from pathlib import Path

from pipebd_core.bench.accuracy_table import accuracy_tables
from pipebd_core.bench.doubt import figure_doubt
from pipebd_core.bench.misses import miss_lines
from pipebd_core.bench.partitions import partitions_lines
from pipebd_core.bench.report import render
from pipebd_core.documents.bench_record import (
    Accuracy,
    Arm,
    BenchRecord,
    Bound,
    KernelSpeed,
    PlanAccuracy,
    Reference,
    RunSpeed,
)
from pipebd_core.documents.distill_plan import StageSpan
from tests.unit.bench_samples import measured_run

RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "record.json"


def arm(name: str, steps: list[float]) -> Arm:
    return Arm(name=name, runs=[measured_run(repeat, step) for repeat, step in enumerate(steps)])


def cut(
    arm_name: str, strategy: str, cut_at: int, predicted: float, measured: float, *partitioners: str
) -> PlanAccuracy:
    return PlanAccuracy(
        arm=arm_name,
        also=[],
        source="partition",
        mode=strategy,
        stages=[StageSpan(start=0, stop=cut_at, replicas=1), StageSpan(start=cut_at, stop=9, replicas=1)],
        partitioners=list(partitioners),
        predicted_step_s=predicted,
        measured_step_s=measured,
        calibrated_step_s=None,
        calibrated_from=None,
    )


def finetune_record(plans: list[PlanAccuracy], arms: list[Arm], name: str = "layerpipe-sample") -> BenchRecord:
    base = BenchRecord.from_json(json.loads(RECORD.read_text()))
    accuracy = Accuracy(
        seed=0, plans=plans, mape=0.0, rank_correlation=None, chosen=plans[0].arm, chosen_regret=0.0,
        calibrated=None, rule="-",
    )  # fmt: skip
    return base.model_copy(
        update={"phase": "finetune", "compares": "plans", "arms": arms, "accuracy": accuracy, "name": name}
    )


def test_each_partitioners_cut_is_a_row_and_a_missed_pick_says_by_how_much_and_why() -> None:
    plans = [
        cut("gpipe", "gpipe", 3, 0.20, 0.33, "layerpipe", "pipedream", "auto"),  # the planner's pick: 10% slower
        cut("gpipe-even", "gpipe", 5, 0.30, 0.30, "even"),
    ]
    record = finetune_record(plans, [arm("gpipe", [0.33, 0.32, 0.34]), arm("gpipe-even", [0.30, 0.29, 0.31])])
    text = "\n".join(partitions_lines(record))
    assert "| gpipe | even | 0-4 \\| 5-8 | gpipe-even | 0.3 | 0.3 [0.29, 0.31] | +0% | best |" in text
    for partitioner in ("pipedream", "layerpipe", "auto"):  # one run, a row for each partitioner that cut it
        assert f"| gpipe | {partitioner} | 0-2 \\| 3-8 | gpipe | 0.2 | 0.33 [0.32, 0.34] | -39% | +10.0% |" in text
    assert (
        "gpipe: the planner's cut (auto, layerpipe = pipedream's) measured 10.0% [9.7%, 10.3%; 3 repeats] slower"
        " than the best measured (even's): 7.0% over the 3% target. The profile predicted the pick 0.2 s and the"
        " best 0.3 s (the pick ahead of it); measured 0.33 s and 0.3 s: the pick's prediction is -39% off, the"
        " best's +0%." in text
    )
    close = finetune_record(plans, [arm("gpipe", [0.33, 0.31, 0.34]), arm("gpipe-even", [0.30, 0.29, 0.32])])
    assert "slower than the best measured (even's), inside the noise" in "\n".join(partitions_lines(close))
    assert "#### Partitions" in render([record])


def test_a_pick_that_is_the_best_cut_says_so_and_a_record_without_partitioners_has_no_table() -> None:
    plans = [cut("zb", "zb", 3, 0.2, 0.2, "pipedream", "auto"), cut("zb-even", "zb", 5, 0.3, 0.3, "even")]
    record = finetune_record(plans, [arm("zb", [0.2, 0.21, 0.19]), arm("zb-even", [0.3, 0.31, 0.29])])
    assert "- zb: the planner's cut (auto, pipedream's) is the best measured." in partitions_lines(record)
    older = [plan.model_copy(update={"partitioners": []}) for plan in plans]  # before the partitions table
    assert partitions_lines(finetune_record(older, record.arms)) == []


def test_a_missed_target_names_the_plans_off_and_the_pairs_ordered_against_the_measurement() -> None:
    plans = [
        cut("a", "gpipe", 3, 1.30, 1.0),  # +30%: predicted slow
        cut("b", "gpipe", 4, 1.25, 2.0),  # -38%: fast, and ordered before a though it measured twice as slow
        cut("c", "gpipe", 5, 3.0, 3.0),
    ]
    arms = {"a": arm("a", [1.0, 1.01, 0.99]), "b": arm("b", [2.0, 2.02, 1.98]), "c": arm("c", [3.0, 3.03, 2.97])}
    doubt = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, "b")
    (said,) = miss_lines(plans, arms, "b", doubt, floor=0.01, phase="finetune")
    assert "MAPE 17.6% over its target 5.0%: of 3 plans, 1 predicted slow by more than the target (a)" in said
    assert "and 1 fast (b)" in said
    assert "the largest errors b -38%, a +30%, c +0%." in said
    assert "Kendall's tau 0.37 under its target 0.7: 1 pairs ordered against a measurement clear of the noise" in said
    assert "(b predicted 4% faster than a, measured 100% slower)" in said
    assert "The chosen plan b measured 100.0% slower than a, beyond the noise" in said
    bound = Bound(t1_s=2.0, ideal_s=1.0, runs=[], profile_ideal_s=1.5)  # the profile's blocks 50% slow
    (with_bound,) = miss_lines(plans, arms, "b", doubt, floor=0.01, phase="finetune", bound=bound)
    assert "The profile's own ideal step (1.5 s) is +50% off the measured bound's (1 s, T1 / N)" in with_bound
    exact = [plan.model_copy(update={"predicted_step_s": plan.measured_step_s}) for plan in plans]
    met = figure_doubt({plan.arm: plan.measured_step_s for plan in plans}, arms, "a")
    assert miss_lines(exact, arms, "a", met, floor=0.01, phase="finetune") == []


def test_the_accuracy_table_has_a_row_a_record_development_or_held_out() -> None:
    plans = [cut("zb", "zb", 3, 0.2, 0.2, "pipedream", "auto"), cut("zb-even", "zb", 5, 0.33, 0.3, "even")]
    arms = [arm("zb", [0.2, 0.2, 0.2]), arm("zb-even", [0.3, 0.3, 0.3])]
    development, held_out = finetune_record(plans, arms), finetune_record(plans, arms, name="tiny-llama-text")
    text = accuracy_tables([("a/dev.json", development), ("a/held.json", held_out)])
    assert text.startswith("**End-to-end training** (Kendall's tau target 0.7;") and "**Distillation**" not in text
    assert "| layerpipe-sample | 2 | 2 | 2 | 0.0% | 5.0% | " in text
    assert "| 0.0% [0.0%, 0.0%] (the fastest) | - | development | `dev.json` |" in text
    assert "| 5.0% [5.0%, 5.0%] | 1.00 [1.00, 1.00] |" in text  # MAPE (0 and 10%) / 2 in every repeat; tau 1
    assert "| held-out | `held.json` |" in text


def test_a_missed_mape_says_how_the_machines_speed_changed_under_the_bench_and_whether_it_explains_the_error() -> None:
    plans = [cut("a", "gpipe", 3, 0.8, 1.0), cut("b", "gpipe", 4, 1.6, 2.0)]  # both predicted 20% fast
    arms = {"a": arm("a", [1.0, 1.01, 0.99]), "b": arm("b", [2.0, 2.02, 1.98])}
    doubt = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, "a")
    start = KernelSpeed(matmul_gflops=100.0, conv_gflops=80.0)
    slowed = Reference(start=start, end=KernelSpeed(matmul_gflops=90.0, conv_gflops=68.0))
    (said,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=slowed)
    assert (
        "The machine's reference speed (one thread) changed -10% (matmul) and -15% (conv) from the bench's start"
        " (just before its profile was measured or read) to its end; the plans' mean error is -20%: a machine"
        " slower after its profile than while profiling predicts every plan fast, by up to that much." in said
    )
    faster = Reference(start=start, end=KernelSpeed(matmul_gflops=110.0, conv_gflops=96.0))
    (against,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=faster)
    assert "changed +10% (matmul) and +20% (conv)" in against
    assert "the change does not point the way the plans are off by more than 5%, so it does not explain" in against
    (without,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill")
    assert "reference speed" not in without
    unfinished = Reference(start=start, end=None)  # a bench still under way has no end speed
    assert miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=unfinished) == [without]


def test_a_missed_mape_sets_the_machines_speed_over_the_runs_beside_its_speed_around_the_profile() -> None:
    plans = [cut("a", "gpipe", 3, 1.2, 1.0), cut("b", "gpipe", 4, 2.4, 2.0)]  # both predicted 20% slow
    arms = {"a": arm("a", [1.0, 1.01, 0.99]), "b": arm("b", [2.0, 2.02, 1.98])}
    doubt = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, "a")
    slow = KernelSpeed(matmul_gflops=100.0, conv_gflops=100.0)
    fast = KernelSpeed(matmul_gflops=110.0, conv_gflops=130.0)  # geometric mean 119.6: 20% faster
    runs = [RunSpeed(run=f"a-{repeat}", speed=fast) for repeat in range(6)]
    profiled_slow = Reference(start=slow, end=slow, after_runs=runs, after_profile=slow)
    (said,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=profiled_slow)
    assert (
        "The reference speed (both kernels' geometric mean) read 100 GFLOP/s just before and right after its"
        " profile and a median of 120 after the runs (+20%); the plans' mean error is +20%: a machine faster in its"
        " runs than while profiling predicts every plan slow, by up to that much." in said
    )
    before_only = Reference(start=slow, end=slow, after_runs=runs)  # a record from before `after_profile`
    (older,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=before_only)
    assert "read 100 GFLOP/s just before its profile and a median of 120" in older
    steady = Reference(start=fast, end=fast, after_runs=runs, after_profile=fast)
    (unexplained,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=steady)
    assert "a median of 120 after the runs (+0%)" in unexplained and "so it does not explain it." in unexplained
    few = Reference(start=slow, end=slow, after_runs=runs[:5], after_profile=slow)  # too few runs to tell
    (short,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=few)
    assert "both kernels' geometric mean" not in short


def predicted_arm(name: str, runs: list[tuple[float, float]]) -> Arm:
    """An arm whose runs each have (measured, predicted) seconds a step."""
    return Arm(
        name=name,
        runs=[
            measured_run(repeat, measured).model_copy(update={"predicted_step_s": predicted})
            for repeat, (measured, predicted) in enumerate(runs)
        ],
    )


def after_each_run(arms: dict[str, Arm], relative: dict[str, list[float]]) -> Reference:
    """A reference speed of 100 / 80 GFLOP/s at the start, then `relative` of it after each arm's runs."""
    start = KernelSpeed(matmul_gflops=100.0, conv_gflops=80.0)
    after = [
        RunSpeed(run=f"{name}-{repeat}", speed=KernelSpeed(matmul_gflops=100.0 * share, conv_gflops=80.0 * share))
        for name in arms
        for repeat, share in enumerate(relative[name])
    ]
    return Reference(start=start, end=start, after_runs=after)


def test_a_missed_mape_sets_each_run_s_error_beside_the_machine_s_speed_after_it() -> None:
    """Pearson r over the runs: the slow runs were measured while the machine was slow (r near +1), or not."""
    plans = [cut("a", "gpipe", 3, 0.8, 1.0), cut("b", "gpipe", 4, 1.6, 2.0)]
    arms = {
        "a": predicted_arm("a", [(1.0, 0.9), (1.2, 0.9), (1.0, 0.9)]),
        "b": predicted_arm("b", [(2.0, 1.8), (2.4, 1.8), (2.0, 1.8)]),
    }
    doubt = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, "a")
    followed = after_each_run(arms, {"a": [1.0, 0.83, 1.0], "b": [1.0, 0.83, 1.0]})  # repeat 1 ran 17% slower
    (said,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=followed)
    assert "The reference speed measured after each of 6 runs ranged 83% to 100% of the start's" in said
    assert "Pearson r = +1.00: the runs taken while the machine was slower are the ones predicted fast" in said
    unrelated = after_each_run(arms, {"a": [0.83, 1.0, 1.0], "b": [1.0, 1.0, 0.83]})
    (other,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=unrelated)
    assert "the errors do not follow the machine's speed run by run" in other
    few = after_each_run({"a": arms["a"]}, {"a": [1.0, 0.83, 1.0]})  # 3 runs: too few to correlate
    (short,) = miss_lines(plans, arms, "a", doubt, floor=0.01, phase="distill", reference=few)
    assert "Pearson" not in short
