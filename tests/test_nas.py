"""Blockwise NAS: MobileNetV2 teacher blocks, supernet students, architecture rounds in every mode.

Tier: pure logic (building, gates, sampling, derivation), then 1-3 rank gloo runs through torchrun on
a small BN-free supernet, where every mode must reach the single-rank run's weights and alphas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision

from pipebd_core.rundir import RunDir
from pipebd_core.spec import SpecError, parse_spec
from pipebd_core.workloads import build_workload, path_generator
from pipebd_core.workloads.supernet import BinaryGates, MixedLayer, SupernetBlock
from tests.helpers import assert_same_weights, load_students, run_job


def nas_document(**sections: dict[str, Any]) -> dict[str, Any]:
    """6 blocks of a quarter-width MobileNetV2 on 16x16 inputs; 6 steps, architecture updates at steps 3 and 5."""
    document: dict[str, Any] = {
        "name": "tiny-nas",
        "workload": {
            "kind": "nas",
            "width_mult": 0.25,
            "layers_per_block": [2, 2, 2, 2, 2, 1],
            "student_norm": "none",
            "arch_update_every": 2,
            "arch_lr": 0.05,
        },
        "data": {"dataset": "synthetic", "image_size": 16, "num_samples": 44, "batch_size": 10},
        "train": {"epochs": 2, "lr": 0.05, "seed": 5},
        "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
    }
    for section, values in sections.items():
        document[section] = {**document[section], **values}
    return document


def test_student_blocks_reproduce_teacher_shapes_and_end_in_logits() -> None:
    for size in (32, 224):
        workload = build_workload(parse_spec(nas_document(data={"image_size": size})))
        assert workload.num_blocks == 6 and workload.losses[-1] == "soft_ce"
        x = torch.randn(2, 3, size, size)
        for teacher, student in zip(workload.teacher_blocks, workload.student_blocks, strict=True):
            target = teacher(x)
            assert student(x).shape == target.shape
            x = target
        assert x.shape == (2, 10)


def test_zero_is_a_candidate_only_where_a_layer_keeps_stride_and_width() -> None:
    assert MixedLayer(8, 8, 1, False, "binary").names[-1] == "zero"
    assert "zero" not in MixedLayer(8, 16, 1, False, "binary").names
    assert "zero" not in MixedLayer(8, 8, 2, False, "binary").names
    assert len(MixedLayer(8, 8, 1, False, "binary").names) == 7  # 3 kernels x 2 expansions + zero


def test_binary_gates_back_propagate_the_proxylessnas_estimate() -> None:
    logits = torch.tensor([0.3, -0.2], requires_grad=True)
    gates = BinaryGates.apply(logits, 1)
    assert gates.tolist() == [0.0, 1.0]
    grad_gates = torch.tensor([2.0, -1.0])
    gates.backward(grad_gates)
    p = torch.softmax(logits.detach(), dim=0)
    expected = [sum(float(grad_gates[j] * p[j] * (float(i == j) - p[i])) for j in range(2)) for i in range(2)]
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, torch.tensor(expected))


def test_path_sampling_depends_on_block_step_and_round_only() -> None:
    def paths(block: int, step: int, round_: str) -> list[tuple[int, ...]]:
        layer = MixedLayer(8, 8, 1, False, "binary")
        layer.alpha.data = torch.tensor([0.5, 0.1, -0.3, 0.2, 0.0, 0.4, -0.1])
        generator = path_generator(7, block, step, round_)
        draws = []
        for _ in range(4):
            layer.sample(round_, generator)
            draws.append(layer.active)
        return draws

    assert paths(2, 5, "weights") == paths(2, 5, "weights")
    assert paths(2, 5, "weights") != paths(2, 6, "weights")
    assert paths(2, 5, "weights") != paths(3, 5, "weights")
    assert all(len(active) == 2 for active in paths(2, 5, "arch"))


def test_loading_a_local_teacher_state_dict(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10).eval()
    path = tmp_path / "mobilenet.pt"
    torch.save(model.state_dict(), path)
    spec = parse_spec(nas_document(workload={"teacher_weights": str(path)}, data={"image_size": 96}))
    workload = build_workload(spec)
    x = torch.randn(2, 3, 96, 96)
    assert workload.teacher_network is not None
    torch.testing.assert_close(workload.teacher_network()(x), model(x))
    wrong = parse_spec(nas_document(workload={"teacher_weights": str(path), "width_mult": 0.5}))
    with pytest.raises(SpecError, match=r"not a torchvision mobilenet_v2 state_dict with width_mult 0\.5"):
        build_workload(wrong)


def test_layer_counts_must_match_the_blocks() -> None:
    with pytest.raises(SpecError, match="layers_per_block has 2 entries but the teacher is cut into 6 blocks"):
        build_workload(parse_spec(nas_document(workload={"layers_per_block": [1, 1]})))


@pytest.mark.parametrize("starts", [[0, 4, 7, 11, 14, 18], [4, 7], [0, 7, 4], [0, 1], [0], "0,4"])
def test_a_split_mobilenet_cannot_take_is_refused(starts: object) -> None:
    layers = [1] * (len(starts) if isinstance(starts, list) else 2)
    document = nas_document(workload={"options": {"block_starts": starts}, "layers_per_block": layers})
    with pytest.raises(SpecError, match=r"workload\.options\.block_starts: .* is not a split of MobileNetV2"):
        build_workload(parse_spec(document))


def test_a_custom_split_builds_matching_blocks() -> None:
    document = nas_document(workload={"options": {"block_starts": [0, 2, 17]}, "layers_per_block": [1, 2, 1]})
    workload = build_workload(parse_spec(document))
    assert workload.num_blocks == 3 and [len(s.layers) for s in workload.student_blocks] == [1, 2, 1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    code, run_dir = run_job(parse_spec(nas_document()), tmp_path_factory.mktemp("nas") / "run")
    assert code == 0, run_dir.rank_errors()
    return run_dir.root


def test_every_block_searches_and_the_result_is_a_standalone_network(reference: Path) -> None:
    students = torch.load(reference / "student.pt", weights_only=True)
    alphas = {key: value for key, value in students.items() if key.endswith(".alpha")}
    assert {key.split(".")[1] for key in alphas} == {str(b) for b in range(6)}
    assert all(value.abs().sum() > 0 for value in alphas.values()), "an architecture parameter never moved"
    architecture = json.loads((reference / "architecture.json").read_text())
    assert [len(block["layers"]) for block in architecture["blocks"]] == [2, 2, 2, 2, 2, 1]
    searched = torch.load(reference / "searched_model.pt", weights_only=False)
    assert searched(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    arch_lines = [
        json.loads(line)
        for line in (reference / "metrics" / "distill" / "rank-0.jsonl").read_text().splitlines()
        if '"arch"' in line
    ]
    assert [line["step"] for line in arch_lines] == [3, 5]
    assert set(arch_lines[0]["arch"]) == {str(b) for b in range(6)}
    assert abs(sum(arch_lines[0]["arch"]["1"][1]) - 1.0) < 1e-5  # probabilities per layer


def test_supernet_blocks_are_searchable_modules() -> None:
    workload = build_workload(parse_spec(nas_document()))
    assert all(isinstance(student, SupernetBlock) for student in workload.student_blocks)


CASES: list[tuple[str, int, Any]] = [
    ("dp", 2, None),
    ("ls", 3, None),
    ("ir", 2, None),
    ("tr", 3, None),
    ("tr_dpu", 2, None),
    ("hybrid", 3, [{"start": 0, "stop": 2, "replicas": 2}, {"start": 2, "stop": 6, "replicas": 1}]),
]


@pytest.mark.parametrize(("mode", "nproc", "stages"), CASES, ids=[f"{m}-{n}" for m, n, _ in CASES])
def test_every_mode_searches_exactly_like_one_rank(
    mode: str, nproc: int, stages: Any, reference: Path, tmp_path: Path
) -> None:
    spec = parse_spec(nas_document(schedule={"mode": mode, "nproc": nproc, "stages": stages}))
    code, run_dir = run_job(spec, tmp_path / "run")
    assert code == 0, run_dir.rank_errors()
    expected = torch.load(reference / "student.pt", weights_only=True)
    assert_same_weights(load_students(run_dir), expected)
    assert run_dir.architecture.read_text() == (reference / "architecture.json").read_text()
    drawn, reference_drawn = paths_drawn(run_dir, nproc), paths_drawn(RunDir(reference), 1)
    assert drawn.keys() == reference_drawn.keys()
    for key, draws in drawn.items():  # every replica that trained a block at a step drew what one rank drew
        assert draws == [reference_drawn[key][0]] * len(draws), key
    if mode in ("dp", "ir", "hybrid"):  # replicated: some block is trained on two ranks at once
        assert max(len(draws) for draws in drawn.values()) == 2


def paths_drawn(run_dir: RunDir, nproc: int) -> dict[tuple[int, str, str], list[Any]]:
    """(step, round, block) -> the paths each rank's telemetry says it drew for that block, one per rank."""
    drawn: dict[tuple[int, str, str], list[Any]] = {}
    for rank in range(nproc):
        for line in run_dir.metrics(rank).read_text().splitlines():
            record = json.loads(line)
            for block, paths in record.get("paths", {}).items():
                drawn.setdefault((record["step"], record["round"], block), []).append(paths)
    assert drawn and len({json.dumps(v[0]) for v in drawn.values()}) > 1  # paths recorded, and they vary
    return drawn


def test_auto_plans_and_runs_the_search(reference: Path, tmp_path: Path) -> None:
    spec = parse_spec(nas_document(schedule={"mode": "auto", "nproc": 2, "profile": True}))
    code, run_dir = run_job(spec, tmp_path / "run")
    assert code == 0, run_dir.rank_errors()
    plan = run_dir.read_json(run_dir.plan)
    assert plan["search"] == {"from_step": 2, "every": 2} and plan["alternatives"]
    segments = plan["simulation"]["chosen"]["segments"]
    arch_steps = {s["step"] for s in segments if s["kind"] == "student" and s["round"] == "arch"}
    simulated = {s["step"] for s in segments}
    assert arch_steps == {step for step in simulated if (step + 1) % 2 == 0}  # steady state: every 2nd step
    assert_same_weights(load_students(run_dir), torch.load(reference / "student.pt", weights_only=True))
