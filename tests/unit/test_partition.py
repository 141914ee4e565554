"""The partitioners of the finetune phase against brute force, each other, and the LayerPipe paper's sample
network; the simulator's replay of a moved share. Tier: pure logic."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from pipebd_core.finetune.schedules import rank_actions
from pipebd_core.planning.finetune_partition import (
    LayerCost,
    Partition,
    even,
    layerpipe,
    pipedream,
    slowest,
    stage_work,
)
from pipebd_core.planning.finetune_simulate import links, moved_times, simulate_pipeline
from pipebd_core.rank.channels import split_channels
from pipebd_core.rank.network import as_network
from pipebd_core.workloads.flops import count_flops
from pipebd_core.workloads.layerpipe_sample import make_network
from tests.fake_profiles import fake_layer_profile


def random_costs(rng: random.Random, count: int) -> list[LayerCost]:
    """Layers of random F, delta and G (some without weights), a random half of them movable (never the
    first, whose input is the data), with a random cost of splitting."""
    costs = []
    for index in range(count):
        g = rng.random() if rng.random() < 0.7 else 0.0
        delta = rng.random() if index else 0.0
        costs.append(LayerCost(rng.random(), delta, g, index > 0 and rng.random() < 0.6, 0.1 * rng.random()))
    return costs


def brute_force(costs: list[LayerCost], parts: int) -> float:
    """Every way to cut the layers into `parts` contiguous stages: the fastest slowest stage among them."""
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), parts - 1):
        stages = itertools.pairwise([0, *cuts, len(costs)])
        best = min(best, max(sum(c.f + c.delta + c.g for c in costs[a:b]) for a, b in stages))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_pipedream_is_the_brute_force_min_max_cut(seed: int) -> None:
    rng = random.Random(seed)
    costs = random_costs(rng, rng.randint(2, 8))
    parts = rng.randint(1, len(costs))
    partition = pipedream(costs, parts)
    assert_valid(costs, partition, parts)
    assert slowest(costs, partition) == pytest.approx(brute_force(costs, parts), rel=1e-12)
    assert partition.moved == [0.0] * (parts - 1)


def assert_valid(costs: list[LayerCost], partition: Partition, parts: int) -> None:
    assert len(partition.stages) == parts and partition.stages[0][0] == 0 and partition.stages[-1][1] == len(costs)
    assert all(a < b for a, b in partition.stages)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(partition.stages))
    for boundary, share in enumerate(partition.moved):
        assert 0.0 <= share <= 1.0
        assert share == 0.0 or costs[partition.stages[boundary][1] - 1].movable  # only movable delta moves


def test_layerpipe_never_predicts_a_slower_slowest_stage_than_pipedream() -> None:
    rng, moved_somewhere = random.Random(7), 0
    for _ in range(400):
        costs = random_costs(rng, rng.randint(2, 10))
        parts = rng.randint(2, min(5, len(costs)))
        balanced, layered = layerpipe(costs, parts), pipedream(costs, parts)
        assert_valid(costs, balanced, parts)
        assert slowest(costs, balanced) <= slowest(costs, layered) * (1 + 1e-9)
        assert slowest(costs, balanced) <= (balanced.target_s or 0.0) * (1 + 1e-9)
        moved_somewhere += any(share > 0 for share in balanced.moved)
    assert moved_somewhere > 100  # the comparison is not only between identical layer-granular cuts


def test_even_cuts_equal_layer_counts() -> None:
    costs = [LayerCost(1.0, 1.0, 1.0)] * 11
    assert even(costs, 3).stages == [(0, 4), (4, 8), (8, 11)]
    assert even(costs, 11).stages == [(i, i + 1) for i in range(11)]


def sample_costs() -> tuple[list[LayerCost], list[int]]:
    """The rebuilt sample network at its FLOPs, as the paper's simulator counts work: F, delta and G each
    the forward's FLOPs (no delta for the first layer, no G without weights); its conv layers' indices."""
    network = as_network(make_network())
    x, costs = torch.randn(1, 3, 32, 32), []
    for index, layer in enumerate(network.layers):
        x, flops = count_flops(layer, x)
        weights = any(True for _ in layer.parameters())
        movable = index > 0 and split_channels(layer) is not None
        costs.append(LayerCost(flops, flops if index else 0.0, flops if weights else 0.0, movable))
    convs = [index for index, layer in enumerate(network.layers) if isinstance(layer, torch.nn.Conv2d)]
    return costs, convs


def test_on_the_papers_sample_network_layerpipe_moves_layer_2s_delta_to_the_next_processor() -> None:
    costs, convs = sample_costs()
    for parts in (3, 2):
        layered = pipedream(costs, parts)
        conv_of_stage = [[i for i in convs if a <= i < b] for a, b in layered.stages]
        paper = [convs[:1], convs[1:2], convs[2:]] if parts == 3 else [convs[:2], convs[2:]]
        assert conv_of_stage == paper  # the paper's PipeDream on three: 1 | 2 | 3 and 4
        balanced = layerpipe(costs, parts)
        assert balanced.stages == layered.stages  # the same layers on the same processors, and then
        owner = parts - 2  # the stage that ends with layer 2 gives part of its delta to the one after it
        share, delta = balanced.moved[owner], costs[convs[1]].delta
        assert balanced.moved[:owner] == [0.0] * owner and share > 0
        before = stage_work(costs, layered.stages, layered.moved)
        after = stage_work(costs, balanced.stages, balanced.moved)
        assert after[owner].delta == pytest.approx(before[owner].delta - share * delta)
        assert after[owner + 1].delta == pytest.approx(before[owner + 1].delta + share * delta)
        gap = before[owner].total - before[owner + 1].total
        assert share == pytest.approx(min(1.0, gap / 2 / delta))  # balanced, or all the delta there is
        assert slowest(costs, balanced) < slowest(costs, layered)


def test_the_replay_moves_the_share_and_its_sends_between_stages() -> None:
    costs = fake_layer_profile(layers=3, f=1.0, i=1.0, w=1.0, b=2.0, p2p_per_byte=0.01)
    stages, moved = [(0, 2), (2, 3)], [0.5]  # half of layer 1's delta computed by stage 1
    plain, shifted = moved_times(costs, stages, [0.0], 4), moved_times(costs, stages, moved, 4)
    assert (shifted[0].i, shifted[1].i) == (plain[0].i - 0.5, plain[1].i + 0.5)
    assert (shifted[0].b, shifted[1].b) == (plain[0].b - 0.5, plain[1].b + 0.5)  # B's input-gradient part
    assert shifted[1].held_bytes == 200 and shifted[0].held_bytes == 4 * 2  # the slice; 4 partial buffers
    plain_link, moved_link = links(costs, stages, [0.0])[1], links(costs, stages, moved)[1]
    assert moved_link.weight_slice == pytest.approx(200 * 0.01)  # half the 400-byte weight, once a step
    assert moved_link.backward == pytest.approx(plain_link.backward + 4 * 0.01)  # half the 4-byte gradient, costed
    # as the smallest measured send (4 bytes): below it, a send costs its latency
    actions = rank_actions("gpipe", 2, 4)  # its backwards run back to back: the slower stage sets their pace
    before = simulate_pipeline("gpipe", stages, actions, costs)
    after = simulate_pipeline("gpipe", stages, actions, costs, moved)
    assert after.stage_s[0] == before.stage_s[0] - 4 * 0.5 and after.stage_s[1] == before.stage_s[1] + 4 * 0.5
    assert after.step_s < before.step_s  # the stages are closer to balanced
