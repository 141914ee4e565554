"""Cost model, exact planner and simulator on hand-written profiles. Tier: pure logic."""

from __future__ import annotations

import itertools

import pytest

from pipebd_core.distill.plan import Plan, build_stages
from pipebd_core.documents.errors import PlanError
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_planner import mode_plans
from pipebd_core.planning.distill_search import best_plan, search
from pipebd_core.planning.distill_simulate import simulate
from pipebd_core.spec import StageSpec
from tests.fake_profiles import fake_profile

TEACHER = [4.0, 1.0, 3.0, 2.0, 0.5]
STUDENT = [1.0, 2.0, 0.5, 1.5, 1.0]


def brute_force(model: CostModel) -> list[tuple[float, list[tuple[int, int, int]]]]:
    """Every contiguous split of the blocks and every replica count per stage, summing to nproc."""
    plans = []
    blocks, nproc = model.num_blocks, model.nproc
    for stages in range(1, min(blocks, nproc) + 1):
        for cuts in itertools.combinations(range(1, blocks), stages - 1):
            bounds = [0, *cuts, blocks]
            for replicas in itertools.product(range(1, nproc + 1), repeat=stages):
                if sum(replicas) != nproc:
                    continue
                triples = [(bounds[i], bounds[i + 1], replicas[i]) for i in range(stages)]
                costs = [model.stage(*triple) for triple in triples]
                if all(model.fits(cost) for cost in costs):
                    plans.append((max(cost.total_s for cost in costs), triples))
    return sorted(plans, key=lambda plan: plan[0])


@pytest.mark.parametrize("nproc", [1, 2, 3, 4])
@pytest.mark.parametrize("comm", [0.0, 0.3])
def test_search_ranks_plans_exactly_like_brute_force(nproc: int, comm: float) -> None:
    model = CostModel(fake_profile(TEACHER, STUDENT, nproc, p2p=comm, allreduce=comm, data=comm))
    expected = brute_force(model)
    result = search(model, top_k=8)
    assert result.considered == len(expected)
    assert [round(plan.step_s, 9) for plan in result.plans] == [round(step, 9) for step, _ in expected[:8]]
    best_step, _ = expected[0]
    assert result.plans[0].step_s == pytest.approx(best_step)
    assert model.pipeline_step(result.plans[0].triples()) == pytest.approx(best_step)


def test_the_bottleneck_stage_is_the_slowest_one() -> None:
    model = CostModel(fake_profile([5.0, 1.0, 1.0], [0.0, 0.0, 0.0], 2))
    plan = best_plan(model, unreplicated=True)
    assert plan.triples() == [(0, 1, 1), (1, 3, 1)] and plan.bottleneck == 0 and plan.step_s == 5.0


def test_replicating_the_heavy_stage_beats_one_rank_per_stage() -> None:
    # one rank per stage is impossible (2 blocks, 3 ranks); ir pays the all-reduce on both blocks:
    # ir = 7 x 4/12 + 2 = 4.33, [0 x2 | 1 x1] = max(6 x 6/12 + 1, 1) = 4
    model = CostModel(fake_profile([6.0, 1.0], [0.0, 0.0], 3, allreduce=1.0))
    assert best_plan(model).triples() == [(0, 1, 2), (1, 2, 1)]


def test_plans_that_exceed_memory_are_rejected() -> None:
    roomy = CostModel(fake_profile(TEACHER, STUDENT, 2))
    assert any(triple[1] - triple[0] == 5 for plan in search(roomy).plans for triple in plan.triples())
    whole = roomy.stage(0, 5, 2).memory_bytes
    tight = CostModel(fake_profile(TEACHER, STUDENT, 2, memory_limit=whole - 1))
    result = search(tight, top_k=50)
    assert result.rejected_for_memory > 0 and result.plans
    for plan in result.plans:
        assert all(stage.memory_bytes <= whole - 1 for stage in plan.stages)
        assert (0, 5, 2) not in plan.triples()
    nothing = CostModel(fake_profile(TEACHER, STUDENT, 2, memory_limit=1))
    with pytest.raises(PlanError, match="no plan fits in memory"):
        best_plan(nothing)


def test_memory_uses_measured_boundary_bytes_and_cuda_peaks_where_the_profile_has_them() -> None:
    assumed = CostModel(fake_profile(TEACHER, STUDENT, 2))
    profile = fake_profile(TEACHER, STUDENT, 2)
    assert assumed.activation_bytes(1, 6) == 4 * 6 * 16  # shapes [4, 2, 2] at float32
    profile.boundary_bytes_per_sample = [2 * 16] * (len(TEACHER) + 1)  # e.g. half-precision activations
    profile.blocks[0].student_peak_bytes = {12: 50_000, 6: 25_000}  # CUDA: more than autograd keeps
    measured = CostModel(profile)
    assert measured.activation_bytes(1, 6) == 2 * 6 * 16
    assert measured.backward_bytes(0, 6) == 25_000 and measured.backward_bytes(1, 6) == 1000 * 6
    assert measured.stage(0, 1, 2).memory_bytes > assumed.stage(0, 1, 2).memory_bytes


def test_planning_twenty_blocks_on_eight_devices_finds_the_exact_optimum_of_a_known_case() -> None:
    # 16 blocks of cost 1 and 4 of cost 4 (32 in all) on 8 ranks: 4 per rank is achievable and optimal
    teacher = [1.0] * 16 + [4.0] * 4
    model = CostModel(fake_profile(teacher, [0.0] * 20, 8, batch_size=64))
    result = search(model, top_k=3)
    assert result.plans[0].step_s == pytest.approx(4.0)
    assert result.considered == sum(
        len(list(itertools.combinations(range(19), s - 1))) * len(list(itertools.combinations(range(7), s - 1)))
        for s in range(1, 9)
    )


def plan_of(model: CostModel, mode: str, triples: list[tuple[int, int, int]]) -> Plan:
    specs = [StageSpec(start=a, stop=b, replicas=k) for a, b, k in triples]
    stages = build_stages(specs, model.nproc, model.num_blocks, model.batch_size)
    return Plan(mode, model.nproc, model.num_blocks, model.batch_size, stages)


@pytest.mark.parametrize("triples", [[(0, 2, 1), (2, 5, 1)], [(0, 1, 2), (1, 5, 1)], [(0, 3, 1), (3, 5, 2)]])
def test_decoupled_simulation_runs_at_the_bottleneck_stage(triples: list[tuple[int, int, int]]) -> None:
    model = CostModel(fake_profile(TEACHER, STUDENT, sum(replicas for _, _, replicas in triples)))
    plan = plan_of(model, "hybrid", triples)
    step, segments = simulate(plan, model, steps=6)
    assert step == pytest.approx(model.pipeline_step(triples))
    assert {segment.rank for segment in segments} == set(range(model.nproc))


def test_simulated_baselines_equal_their_closed_forms() -> None:
    model = CostModel(fake_profile(TEACHER, STUDENT, 2, allreduce=0.1, data=0.2))
    plans = mode_plans(model)
    assert simulate(plans["dp"], model)[0] == pytest.approx(model.dp_step())
    assert simulate(plans["ls"], model)[0] == pytest.approx(model.ls_step())
    assert simulate(plans["ir"], model)[0] == pytest.approx(model.stage(0, 5, 2).total_s)


def test_barriers_cost_tr_its_bubbles_and_the_ideal_bound_holds() -> None:
    model = CostModel(fake_profile(TEACHER, STUDENT, 2, p2p=0.2))
    plans = mode_plans(model)
    tr, tr_dpu = simulate(plans["tr"], model)[0], simulate(plans["tr_dpu"], model)[0]
    assert tr_dpu == pytest.approx(model.pipeline_step([(s.start, s.stop, 1) for s in plans["tr_dpu"].stages]))
    assert tr > tr_dpu  # the second stage waits for the first stage's teacher every step
    assert model.ideal_step() <= tr_dpu <= simulate(plans["dp"], model)[0]


def test_gantt_segments_are_ordered_and_never_overlap_on_a_rank() -> None:
    model = CostModel(fake_profile(TEACHER, STUDENT, 3, p2p=0.1, allreduce=0.2))
    _, segments = simulate(plan_of(model, "hybrid", [(0, 1, 2), (1, 5, 1)]), model, steps=4)
    kinds = {segment.kind for segment in segments}
    assert {"data", "teacher", "student", "recv", "allreduce"} <= kinds
    for rank in range(3):
        mine = [s for s in segments if s.rank == rank]
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(mine))


def test_uneven_shards_between_profiled_sizes_are_costed_by_scaling() -> None:
    # 12 rows over 5 replicas: shards 3, 3, 2, 2, 2; only ceil(12/k) sizes (12, 6, 4, 3) were profiled
    model = CostModel(fake_profile(TEACHER, STUDENT, 5, data=0.5))
    assert model.teacher(0, 2) == pytest.approx(model.teacher(0, 3) * 2 / 3)
    step, segments = simulate(plan_of(model, "ir", [(0, 5, 5)]), model, steps=4)
    assert step == pytest.approx(model.stage(0, 5, 5).total_s)  # the 3-row shards set the pace
    assert {s.rank for s in segments} == set(range(5))


def test_the_replayed_schedules_have_the_bubbles_of_their_tick_tables() -> None:
    from pipebd_core.finetune.schedules import rank_actions
    from pipebd_core.planning.finetune_simulate import simulate_pipeline
    from tests.fake_profiles import fake_layer_profile

    stages, microbatches = 3, 4
    costs = fake_layer_profile(layers=stages, f=1.0, i=1.0, w=1.0, b=2.0)
    cuts = [(s, s + 1) for s in range(stages)]
    results = {
        strategy: simulate_pipeline(strategy, cuts, rank_actions(strategy, stages, microbatches), costs)
        for strategy in ("gpipe", "1f1b")
    }
    for result in results.values():  # (M + S - 1) ticks of forward and backward: the GPipe/1F1B makespan
        assert result.step_s == pytest.approx((microbatches + stages - 1) * 3.0)
    zb = simulate_pipeline("zb", cuts, rank_actions("zb", stages, microbatches), costs)
    assert zb.step_s < results["1f1b"].step_s  # W moved into the bubbles
    assert min(zb.busy) > min(results["1f1b"].busy)
    gpipe_memory, one_f_one_b_memory = results["gpipe"].memory_bytes[0], results["1f1b"].memory_bytes[0]
    assert gpipe_memory > one_f_one_b_memory  # 1F1B keeps at most S - s micro-batches alive, GPipe all M


def test_a_tensor_sent_to_a_busy_stage_is_transferred_once_it_posts_its_receive() -> None:
    """Two one-layer stages (F 1 s, B 2 s), GPipe over 2 micro-batches, 0.1 s a send: stage 1's second
    forward input is sent at 2.0 while it computes until 2.1, so it starts at 2.2, not 2.1; stage 0's
    second gradient is sent at 7.2 while it computes until 7.3, so its backward starts at 7.4."""
    from pipebd_core.finetune.schedules import rank_actions
    from pipebd_core.planning.finetune_simulate import simulate_pipeline
    from tests.fake_profiles import fake_layer_profile

    costs = fake_layer_profile(layers=2, f=1.0, i=1.0, w=1.0, b=2.0, p2p_per_byte=0.025)
    assert costs.p2p(1) == pytest.approx(0.1)
    result = simulate_pipeline("gpipe", [(0, 1), (1, 2)], rank_actions("gpipe", 2, 2), costs)
    starts = {(s["rank"], s["kind"], s["microbatch"]): s["start"] for s in result.segments}
    assert starts[(1, "F", 0)] == pytest.approx(1.1)  # stage 1 idle: the transfer follows the send
    assert starts[(1, "F", 1)] == pytest.approx(2.2)
    assert starts[(0, "B", 0)] == pytest.approx(5.3)
    assert starts[(0, "B", 1)] == pytest.approx(7.4)
    assert result.step_s == pytest.approx(9.4)


def test_ranks_computing_at_once_share_the_node_as_the_profile_measured() -> None:
    """Two one-layer stages whose F 1 s and B 2 s were profiled with both ranks computing, on a node where
    two computing ranks each run at half speed (co_run [1, 2]): alone, F takes 0.5 s and B 1 s. GPipe over
    2 micro-batches: stage 0's F1 overlaps stage 1's F0 (both 1 s), stage 1's F1 runs alone (0.5 s), its
    B0 alone (1 s), its B1 beside stage 0's B0 (2 s each), stage 0's B1 alone (1 s): a 6 s step, against
    the 9 s of ranks that never slow each other."""
    from pipebd_core.finetune.schedules import rank_actions
    from pipebd_core.planning.finetune_simulate import TrainCosts, simulate_pipeline
    from tests.fake_profiles import fake_layer_profile

    flat = fake_layer_profile(layers=2, f=1.0, i=1.0, w=1.0, b=2.0)
    shared = TrainCosts(flat.profile.model_copy(update={"nproc": 2, "co_run": [1.0, 2.0]}))
    cuts, lists = [(0, 1), (1, 2)], rank_actions("gpipe", 2, 2)
    result = simulate_pipeline("gpipe", cuts, lists, shared)
    spans = {(s["rank"], s["kind"], s["microbatch"]): (s["start"], s["end"]) for s in result.segments}
    assert spans[(0, "F", 0)] == pytest.approx((0.0, 0.5))
    assert spans[(0, "F", 1)] == pytest.approx((0.5, 1.5)) and spans[(1, "F", 0)] == pytest.approx((0.5, 1.5))
    assert spans[(1, "F", 1)] == pytest.approx((1.5, 2.0)) and spans[(1, "B", 0)] == pytest.approx((2.0, 3.0))
    assert spans[(1, "B", 1)] == pytest.approx((3.0, 5.0)) and spans[(0, "B", 0)] == pytest.approx((3.0, 5.0))
    assert spans[(0, "B", 1)] == pytest.approx((5.0, 6.0)) and result.step_s == pytest.approx(6.0)
    assert simulate_pipeline("gpipe", cuts, lists, flat).step_s == pytest.approx(9.0)


def test_optimiser_steps_taken_together_share_the_node_by_their_own_curve() -> None:
    """An optimiser step reads and writes every parameter, gradient and momentum: ranks stepping at once share
    the node's memory bandwidth, measured apart from computing (co_run_optim, 2x for two ranks in this
    fixture). DDP's ranks all step at once; a pipeline's stages
    step as each ends, so only the overlap slows them; a profile without the curve slows nothing."""
    from pipebd_core.documents.profile import Timing
    from pipebd_core.planning.finetune_simulate import TrainCosts, simulate_ddp
    from tests.fake_profiles import fake_layer_profile

    flat = fake_layer_profile(layers=2, f=1.0, i=1.0, w=1.0, b=2.0)
    layers = [
        layer.model_copy(update={"shard": layer.shard.model_copy(update={"optim": Timing(median=0.5, trials=1)})})
        for layer in flat.profile.layers
    ]
    alone = TrainCosts(flat.profile.model_copy(update={"nproc": 2, "layers": layers}))
    shared = TrainCosts(alone.profile.model_copy(update={"co_run_optim": [1.0, 2.0]}))
    assert shared.optimiser_ends([0.0, 0.0], [2.0, 2.0]) == pytest.approx([4.0, 4.0])  # together: half speed each
    assert shared.optimiser_ends([0.0, 3.0], [2.0, 2.0]) == pytest.approx([2.0, 5.0])  # one after the other
    assert shared.optimiser_ends([0.0, 1.0], [2.0, 2.0]) == pytest.approx([3.0, 4.0])  # 1 s alone, 2 s together
    assert shared.optimiser_ends([0.0, 0.0], [0.0, 2.0]) == pytest.approx([0.0, 2.0])  # nothing to step, no slowing
    assert alone.optimiser_ends([0.0, 0.0], [2.0, 2.0]) == pytest.approx([2.0, 2.0])  # not measured: no slowdown
    ddp_alone, ddp_shared = simulate_ddp(alone, 2, 2), simulate_ddp(shared, 2, 2)
    assert ddp_shared.step_s - ddp_alone.step_s == pytest.approx(1.0)  # the whole network's 1 s step, taken twice over
    assert ddp_shared.stage_s == pytest.approx([s + 1.0 for s in ddp_alone.stage_s])
