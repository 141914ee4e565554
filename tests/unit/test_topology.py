"""Planning across nodes on hand-written profiles: the link fit, which sends and groups cross nodes, the cost
model and simulator charging them by link, the planner's exact ranking with placement, and the what-if of
`pipebd plan --nodes --link-gbps` from a profile of one node. Tier: pure logic."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from pipebd_core.cli import main
from pipebd_core.distill.plan import Plan, build_stages
from pipebd_core.documents.profile import LinkFit, Profile
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_search import best_plan, search
from pipebd_core.planning.distill_simulate import simulate
from pipebd_core.planning.profiles import CACHE_ENV, store
from pipebd_core.planning.topology import Topology, ring_allreduce_s, stated_link
from pipebd_core.profile.measure import fit_link
from pipebd_core.spec import StageSpec, parse_spec
from tests.fake_profiles import fake_profile
from tests.helpers import tiny_document

SLOW = stated_link(1.0, 50e-6)  # 1 Gbit/s, 50 us
FAST = stated_link(1000.0, 0.0)


def relay_profile(nproc: int) -> Profile:
    """4 blocks (3, 1, 1, 1 s of work): the balanced cut is after block 0, where 240 MB a batch crosses (2 s
    at 1 Gbit/s); after block 1 only 12 kB does."""
    profile = fake_profile([2.0, 0.5, 0.5, 0.5], [1.0, 0.5, 0.5, 0.5], nproc, allreduce=1e-5)
    per_sample = [64, 2 * 10**7, 1000, 2 * 10**7, 64]
    return profile.model_copy(update={"boundary_bytes_per_sample": per_sample})


def test_a_link_fit_recovers_latency_and_bandwidth_from_measured_sends() -> None:
    points = [(size, 40e-6 + size / 2e9) for size in (10**3, 10**5, 10**6, 10**7) for _ in range(3)]
    fit = fit_link(points)
    assert fit is not None
    assert fit.latency_s == pytest.approx(40e-6, rel=1e-6) and fit.bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert fit.gbit_per_s == pytest.approx(16.0) and fit.send_s(10**6) == pytest.approx(40e-6 + 5e-4)
    assert fit_link([(1000, 0.1), (1000, 0.2)]) is None  # one size: nothing to fit
    flat = fit_link([(1000, 0.2), (2000, 0.1), (2000, 0.3)])  # time not growing with bytes: latency-bound
    assert flat is not None and flat.latency_bound and flat.latency_s == pytest.approx(0.2)
    assert flat.bytes_per_s == pytest.approx(2000 / 0.2)  # a lower bound, so a crossing is never free
    with pytest.raises(ValueError, match="0 Gbit/s carries nothing"):
        stated_link(0, 0.0)


def test_sends_and_groups_cross_nodes_by_the_ranks_of_each_node() -> None:
    two_by_two = Topology(nodes=2, per_node=2, inter=SLOW)
    assert two_by_two.ranks == 4 and [two_by_two.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert not two_by_two.crosses(0, 1) and two_by_two.crosses(1, 2)
    assert two_by_two.spans([1, 2]) and not two_by_two.spans([2, 3])
    assert two_by_two.receive_crosses([0, 1], [2], batch_size=8)  # both producers on node 0
    assert not two_by_two.receive_crosses([0], [1], batch_size=8)
    assert two_by_two.receive_crosses([1], [2, 3], batch_size=8)
    assert not Topology(nodes=1, per_node=4).receive_crosses([0], [3], batch_size=8)
    plan = Plan(
        "hybrid",
        4,
        4,
        8,
        build_stages([StageSpec(start=0, stop=2, replicas=2), StageSpec(start=2, stop=4, replicas=2)], 4, 4, 8),
        nodes=2,
    )
    routes = plan.document().routes
    assert [(r.src, r.dst, r.crosses_nodes) for r in routes] == [(0, 2, True), (1, 3, True)]


def test_a_send_and_an_all_reduce_between_nodes_are_charged_by_the_link() -> None:
    profile = relay_profile(2)
    one_node = CostModel(profile)
    slow = CostModel(profile, topology=Topology(2, 1, SLOW))
    batch, nbytes = 12, 12 * profile.boundary_bytes_per_sample[1]
    assert one_node.p2p(1, batch, crosses=True) == one_node.p2p(1, batch)  # no link between nodes on one node
    assert slow.p2p(1, batch, crosses=True) == pytest.approx(50e-6 + nbytes / SLOW.bytes_per_s)
    gradient = profile.blocks[0].student_param_bytes
    assert slow.allreduce(0, 2, spans=True) == pytest.approx(ring_allreduce_s(gradient, 2, SLOW))
    assert ring_allreduce_s(gradient, 2, SLOW) > 1e-5
    assert slow.allreduce(0, 2) == pytest.approx(1e-5)
    more = CostModel(profile, topology=Topology(2, 2, SLOW))  # 4 ranks from a 2-rank profile
    assert more.allreduce(0, 4) == pytest.approx(1e-5 * (3 / 4) / (1 / 2))  # a ring's traffic, 2 (k-1)/k
    assert slow.dp_step() > one_node.dp_step()


def test_the_planner_cuts_where_little_crosses_a_slow_link_and_simulates_what_it_predicts() -> None:
    profile = relay_profile(2)
    fast = CostModel(profile, topology=Topology(2, 1, FAST))
    assert best_plan(fast, unreplicated=True).triples() == [(0, 1, 1), (1, 4, 1)]
    slow = CostModel(profile, topology=Topology(2, 1, SLOW))
    chosen = best_plan(slow, unreplicated=True)
    assert chosen.triples() == [(0, 2, 1), (2, 4, 1)]  # 12 kB over the link instead of 10 MB
    assert chosen.step_s == pytest.approx(slow.pipeline_step(chosen.triples()))
    plan = Plan(
        "hybrid",
        2,
        4,
        12,
        build_stages([StageSpec(start=a, stop=b, replicas=k) for a, b, k in chosen.triples()], 2, 4, 12),
        nodes=2,
    )
    assert simulate(plan, slow)[0] == pytest.approx(chosen.step_s, rel=0.01)
    one_node = CostModel(profile)  # the same two ranks on one node: the balanced cut
    assert best_plan(one_node, unreplicated=True).triples() == [(0, 1, 1), (1, 4, 1)]
    # replicating everything sends no activations at all; its small gradients cross the link instead
    assert best_plan(slow).triples() == [(0, 4, 2)]


@pytest.mark.parametrize("link", [SLOW, FAST], ids=["1-gbit", "1000-gbit"])
def test_the_ranking_with_placement_equals_brute_force(link: LinkFit) -> None:
    model = CostModel(relay_profile(4), topology=Topology(2, 2, link))
    expected = []
    for stages in range(1, 5):
        for cuts in itertools.combinations(range(1, 4), stages - 1):
            bounds = [0, *cuts, 4]
            for replicas in itertools.product(range(1, 5), repeat=stages):
                if sum(replicas) == 4:
                    triples = [(bounds[i], bounds[i + 1], replicas[i]) for i in range(stages)]
                    expected.append(model.pipeline_step(triples))
    result = search(model, top_k=8)
    assert result.considered == len(expected)
    assert [round(plan.step_s, 9) for plan in result.plans] == [round(step, 9) for step in sorted(expected)[:8]]


def test_pipebd_plan_predicts_several_nodes_from_a_profile_of_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    document = tiny_document(schedule={"nproc": 1, "mode": "tr", "profile": True})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(document))
    profile = relay_profile(1).model_copy(update={"links": {"intra": stated_link(100.0, 20e-6)}})
    store(parse_spec(document), profile)  # the one-node profile `pipebd profile` would have cached

    assert main(["plan", str(spec_path), "--nodes", "2", "--link-gbps", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["machines"].startswith("2 nodes x 1 ranks, 1.00 Gbit/s and 0.020 ms between nodes (stated")
    assert [(s["start"], s["stop"], s["replicas"]) for s in report["plans"][0]["stages"]] == [(0, 4, 2)]
    assert report["crossing_routes"] == []  # the best plan replicates: nothing relayed between nodes
    assert main(["plan", str(spec_path), "--nodes", "2", "--link-gbps", "1"]) == 0
    printed = capsys.readouterr().out
    assert "the best plan's sends between nodes: none" in printed and "predicted ms per global step: dp" in printed

    assert main(["plan", str(spec_path), "--nodes", "2"]) == 2
    assert "no profile measured across 2 nodes is cached" in capsys.readouterr().err
    assert main(["plan", str(spec_path), "--nodes", "2", "--link-gbps", "-1"]) == 2
    assert "--link-gbps: a link of -1.0 Gbit/s carries nothing" in capsys.readouterr().err
    document["schedule"].update(nodes=2, elastic={"min_nodes": 2})  # its bounds are no matter to a what-if
    spec_path.write_text(json.dumps(document))
    assert main(["plan", str(spec_path), "--nodes", "1", "--json"]) == 0  # below min_nodes, planned all the same
    assert json.loads(capsys.readouterr().out)["machines"] == "1 node x 1 ranks"


def test_end_to_end_training_charges_sends_and_all_reduces_between_nodes_at_their_link() -> None:
    """Two stages of two layers (F 1 s, B 2 s each a micro-batch; sends inside a node free) under 1f1b over 2
    micro-batches: 18 s on one node. On two nodes of one rank, each 4-byte boundary tensor takes the link's
    0.5 s + 4 B / (4 B/s) = 1.5 s each way, handed over once the receiver has posted its receive: stage 1's
    F0 begins at 3.5 and B0 ends at 9.5, its F1 at 11-13, B1 at 13-17; stage 0's B0 runs 11-15 and B1
    18.5-22.5. DDP's all-reduce of the 1,600 bytes of parameters over the two nodes is the ring's
    2 x 0.5 s + 1,600 B / (4 B/s) = 401 s (the profile measured 0 s on one node)."""
    from pipebd_core.finetune.schedules import rank_actions
    from pipebd_core.planning.finetune_simulate import TrainCosts, simulate_ddp, simulate_pipeline
    from tests.fake_profiles import fake_layer_profile

    profile = fake_layer_profile(layers=4, f=1.0, i=1.0, w=1.0, b=2.0).profile.model_copy(update={"nproc": 2})
    link = LinkFit(latency_s=0.5, bytes_per_s=4.0)
    one_node, two_nodes = TrainCosts(profile), TrainCosts(profile, Topology(2, 1, link))
    cuts, lists = [(0, 2), (2, 4)], rank_actions("1f1b", 2, 2)
    assert simulate_pipeline("1f1b", cuts, lists, one_node).step_s == pytest.approx(18.0)
    across = simulate_pipeline("1f1b", cuts, lists, two_nodes)
    spans = {(s["rank"], s["kind"], s["microbatch"]): (s["start"], s["end"]) for s in across.segments}
    assert spans[(1, "F", 0)] == pytest.approx((3.5, 5.5)) and spans[(1, "F", 1)] == pytest.approx((11.0, 13.0))
    assert spans[(0, "B", 0)] == pytest.approx((11.0, 15.0)) and across.step_s == pytest.approx(22.5)
    assert simulate_ddp(one_node, 4, 2).step_s == pytest.approx(3 * 4.0)  # F + B of the shard, nothing to reduce
    assert simulate_ddp(two_nodes, 4, 2).step_s == pytest.approx(3 * 4.0 + 401.0)
    # a layer profile measured across nodes carries its link: the machines planned for are its own
    measured = profile.model_copy(update={"nodes": 2, "inter": link})
    assert TrainCosts(measured).machines == Topology(2, 1, link) == Topology(2, 1, link).on(2, 1)
    assert Topology.of_layers(measured).on(1, 1) == Topology(1, 1, link)  # resumed on one node: no send crosses


def test_pipebd_plan_predicts_the_finetune_on_several_nodes_from_a_layer_profile_of_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 11-layer classifier of the finetune tests, every layer F 1 s, B 2 s a micro-batch and 1 GB of weights
    (a hand-written layer profile of one node, cached as `pipebd profile` would): on 2 nodes of one rank, DDP's
    all-reduce of the 11 GB is the ring's 11 GB / (link bytes/s), 88 s at 1 Gbit/s (121 s a step: a pipeline
    wins, cut in two), 0.088 s at 1000 Gbit/s (DDP wins, 33.088 s). A pinned strategy is planned as pinned."""
    from tests.fake_profiles import fake_layer_profile
    from tests.ranks.test_finetune import e2e_document

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    document = e2e_document("auto", 1, profile=True)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(document))
    layers = fake_layer_profile(layers=11, f=1.0, i=1.0, w=1.0, b=2.0).profile
    heavy = [layer.model_copy(update={"param_bytes": 10**9}) for layer in layers.layers]
    store(parse_spec(document), layers.model_copy(update={"layers": heavy}))

    def planned(*what_if: str) -> dict:
        assert main(["plan", str(spec_path), "--nodes", "2", *what_if, "--json"]) == 0
        return dict(json.loads(capsys.readouterr().out))

    slow = planned("--link-gbps", "1")
    assert slow["machines"].startswith("2 nodes x 1 ranks, 1.00 Gbit/s") and "plans" not in slow  # no distillation
    tuned = slow["finetune"]
    assert tuned["strategy"] != "ddp" and len(tuned["stages"]) == 2 and tuned["requested_strategy"] == "auto"
    ddp = next(entry for entry in tuned["strategies"] if entry["strategy"] == "ddp")
    assert ddp["step_s"] == pytest.approx(33.0 + 88.0) and tuned["predicted_step_s"] < ddp["step_s"]
    fast = planned("--link-gbps", "1000")["finetune"]
    assert (fast["strategy"], fast["stages"], fast["predicted_step_s"]) == ("ddp", [[0, 11]], pytest.approx(33.088))
    assert main(["plan", str(spec_path), "--nodes", "2", "--link-gbps", "1"]) == 0
    printed = capsys.readouterr().out
    assert f"finetune: {tuned['strategy']} (chosen by auto), layers 0-" in printed and "ddp    121000.0 ms" in printed

    document["finetune"]["strategy"] = "1f1b"
    spec_path.write_text(json.dumps(document))
    pinned = planned("--link-gbps", "1000")["finetune"]
    assert (pinned["strategy"], pinned["requested_strategy"], len(pinned["stages"])) == ("1f1b", "1f1b", 2)
    assert main(["plan", str(spec_path), "--nodes", "2"]) == 2
    assert "no layer profile measured across 2 nodes is cached" in capsys.readouterr().err
