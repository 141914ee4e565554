"""tier: pure logic, CPU (one rank's profile measured in this process)

A transformer search under `workload.budget.latency`: the profiler times every candidate's forward and the
teacher layer's at the global batch; the search picks the choice of least summed loss whose summed latency
is within the fraction of the teacher's (brute force over every choice agrees) and records each latency in
architecture.json; the plan phase refuses a latency budget no choice meets, with the smallest reachable
fraction; a spec without the profile phase is refused.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from pipebd_core.documents.profile import Profile
from pipebd_core.profile.blocks import measure_rank, pool
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.transformer import check_latency_budget
from pipebd_core.workloads.workload import build_workload
from tests.transformer_specs import TINY_LLAMA, transformer_document, write_text

NAMES = ["keep", "ffn_1/4", "no_attention", "noop"]
CPU = torch.device("cpu")


def search_spec(root: Path, budget: dict[str, float], profile: bool = True) -> Spec:
    document = transformer_document(root, schedule={"profile": profile})
    document["workload"] = {"kind": "transformer", "config": TINY_LLAMA, "replacements": NAMES, "budget": budget}
    return parse_spec(document)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Profile]:
    """The profile phase of the search, one rank, measured here."""
    root = write_text(tmp_path_factory.mktemp("text"))
    spec = search_spec(root, {"latency": 0.5})
    return root, pool([measure_rank(spec, CPU, trials=5)], spec, CPU)


def test_the_profile_times_every_candidate_and_the_teacher_layer(measured: tuple[Path, Profile]) -> None:
    _, profile = measured
    assert len(profile.blocks) == TINY_LLAMA["num_hidden_layers"]
    for block in profile.blocks:
        assert [timing.trials for timing in block.candidate_forward_s] == [5] * len(NAMES)
        assert block.layer_forward_s is not None and block.layer_forward_s.trials == 5
        keep, noop = block.candidate_forward_s[0].median, block.candidate_forward_s[-1].median
        assert noop < 0.5 * keep  # an identity against a whole decoder layer
    assert Profile.from_json(profile.to_json()).blocks[0].candidate_forward_s == profile.blocks[0].candidate_forward_s


def test_a_latency_budget_picks_the_best_choice_within_it(measured: tuple[Path, Profile]) -> None:
    root, profile = measured
    fraction = 0.5
    workload = build_workload(search_spec(root, {"latency": fraction}))
    assert workload.derive is not None
    architecture = workload.derive(workload.student_blocks, profile)[0].to_json()
    latency = [[timing.median for timing in block.candidate_forward_s] for block in profile.blocks]
    teacher = sum(block.layer_forward_s.median for block in profile.blocks if block.layer_forward_s)
    assert architecture["teacher_latency_s"] == pytest.approx(teacher)
    per_layer = [[c for c in architecture["candidates"] if c["block"] == b] for b in range(workload.num_blocks)]
    assert [[c["latency_s"] for c in layer] for layer in per_layer] == latency
    best = min(
        sum(layer[p]["loss"] for layer, p in zip(per_layer, picks, strict=True))
        for picks in itertools.product(range(len(NAMES)), repeat=workload.num_blocks)
        if sum(latency[b][p] for b, p in enumerate(picks)) <= fraction * teacher
    )
    chosen = [NAMES.index(block["layers"][0]) for block in architecture["blocks"]]
    assert sum(layer[p]["loss"] for layer, p in zip(per_layer, chosen, strict=True)) == pytest.approx(best, rel=1e-9)
    assert architecture["reached"]["latency"] == pytest.approx(
        sum(latency[b][p] for b, p in enumerate(chosen)) / teacher
    )
    assert architecture["reached"]["latency"] <= fraction and architecture["budget"] == {"latency": fraction}


def test_a_latency_budget_no_choice_meets_is_refused_at_the_plan_phase(measured: tuple[Path, Profile]) -> None:
    root, profile = measured
    cheapest = sum(min(t.median for t in block.candidate_forward_s) for block in profile.blocks)
    reachable = cheapest / sum(block.layer_forward_s.median for block in profile.blocks if block.layer_forward_s)
    check_latency_budget(search_spec(root, {"latency": min(1.0, 2 * reachable)}), profile)  # reachable: passes
    with pytest.raises(SpecError, match=rf"workload.budget.latency: .* can reach \({reachable:.3f} .*noop"):
        check_latency_budget(search_spec(root, {"latency": reachable / 2}), profile)
    with pytest.raises(SpecError, match=r"workload.budget.latency: the profile has no candidate timings"):
        check_latency_budget(search_spec(root, {"latency": 0.5}), None)


def test_a_latency_budget_without_the_profile_phase_is_refused(measured: tuple[Path, Profile]) -> None:
    root, _ = measured
    with pytest.raises(SpecError, match=r"budget.latency: .* measured by the profile phase .* schedule.profile: true"):
        search_spec(root, {"latency": 0.5}, profile=False)
