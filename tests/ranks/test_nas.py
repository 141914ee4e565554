"""Blockwise NAS: MobileNetV2 teacher blocks, supernet students, architecture rounds in every mode.

Tier: pure logic (building, gates, sampling, derivation), then 1-3 rank gloo runs through torchrun on
a small supernet with BatchNorm, where the single-rank run must reach a plain full-batch loop's weights,
alphas and running statistics, and every mode the single-rank run's. The batch of 11 splits unevenly
over 2 (6, 5) and 3 (4, 4, 3) ranks, so replicas combine BatchNorm statistics of unequal shards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision

from pipebd_core.data.batches import stream_batch_indices
from pipebd_core.data.datasets import build_dataset
from pipebd_core.data.streams import StepPlan
from pipebd_core.distill.schedule import arch_update_index
from pipebd_core.documents.profile import Profile
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_planner import step_plan
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.supernet import BinaryGates, MixedLayer, SupernetBlock, soft_cross_entropy
from pipebd_core.workloads.workload import build_workload, path_generator
from tests.helpers import assert_same_weights, load_students, run_job


def nas_document(**sections: dict[str, Any]) -> dict[str, Any]:
    """6 blocks of a quarter-width MobileNetV2 on 16x16 inputs; 6 steps, architecture updates at steps 3 and 5.

    Seed 0 because BatchNorm and ReLU6 make blockwise training discontinuous: where an activation lands
    within rounding distance of a kink, summing in another order (another shard split, another thread
    count) flips that unit and the run differs by ~1e-3. Seed 1 does that here; seed 0 does not (the
    worst parameter of any mode uses 0.53 of assert_same_weights' tolerance)."""
    document: dict[str, Any] = {
        "name": "tiny-nas",
        "workload": {
            "kind": "nas",
            "width_mult": 0.25,
            "layers_per_block": [2, 2, 2, 2, 2, 1],
            "student_norm": "batch",
            "arch_update_every": 2,
            "arch_lr": 0.05,
        },
        "data": {"dataset": "synthetic", "image_size": 16, "num_samples": 44, "batch_size": 11},
        "train": {"epochs": 2, "lr": 0.05, "seed": 0},
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


def search_rounds(spec: Spec, steps: StepPlan, step: int) -> list[tuple[str, list[int]]]:
    """The rounds of one step and the sample indices of their batches: weights, then arch if it updates."""
    rounds = [("weights", stream_batch_indices(spec, steps.train, step))]
    update = arch_update_index(step, steps.search)
    if update is not None:
        assert steps.arch is not None, "a search holds out the architecture batches"
        rounds.append(("arch", stream_batch_indices(spec, steps.arch, update)))
    return rounds


def plain_search(spec: Spec) -> dict[str, torch.Tensor]:
    """Blockwise NAS written out on the full batch: per step the weight round (SGD, cosine learning rate),
    then at architecture updates the arch round on a held-out batch (Adam); paths from path_generator.

    One thread, as a rank runs: CPU kernels sum in an order that depends on the thread count."""
    workload, dataset, steps, train = build_workload(spec), build_dataset(spec), step_plan(spec), spec.train
    students = [s for s in workload.student_blocks if isinstance(s, SupernetBlock)]
    assert workload.search is not None and len(students) == workload.num_blocks
    sgd = [
        torch.optim.SGD(
            list(s.weight_parameters()), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
        )
        for s in students
    ]
    adam = [torch.optim.Adam(s.arch_parameters(), workload.search.arch_lr, betas=(0.0, 0.999)) for s in students]
    for param in (p for s in students for p in s.parameters()):
        param.grad = torch.zeros_like(param)  # every weight steps every step, drawn or not (momentum, decay)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(steps.total):
            lr = train.lr * 0.5 * (1 + math.cos(math.pi * step / steps.total))
            for round_, indices in search_rounds(spec, steps, step):
                x = torch.stack([dataset[i][0] for i in indices])
                for block, (teacher, student) in enumerate(zip(workload.teacher_blocks, students, strict=True)):
                    with torch.no_grad():
                        target = teacher(x)
                    student.begin_round(round_, path_generator(train.seed, block, step, round_))
                    loss = soft_cross_entropy if workload.loss_of(block) == "soft_ce" else F.mse_loss
                    loss(student(x), target).backward()
                    optimizer = sgd[block] if round_ == "weights" else adam[block]
                    if round_ == "weights":
                        optimizer.param_groups[0]["lr"] = lr
                    optimizer.step()
                    student.zero_grad(set_to_none=False)
                    x = target
    finally:
        torch.set_num_threads(threads)
    return {f"blocks.{i}.{k}": v for i, s in enumerate(students) for k, v in s.state_dict().items()}


def test_single_rank_search_equals_the_plain_loop(reference: Path) -> None:
    students = torch.load(reference / "student.pt", weights_only=True)
    assert_same_weights(students, plain_search(parse_spec(nas_document())))
    assert int(students["blocks.0.prefix.1.num_batches_tracked"]) == 8  # 6 weight rounds and 2 arch rounds


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


# dp and ir at 3 ranks only: the batch of 11 splits unevenly over 3 (4, 4, 3) as over 2 (6, 5), and 3
# replicas add one whose shard is neither the first nor the last; 2 ranks would cover nothing more.
CASES: list[tuple[str, int, Any]] = [
    ("dp", 3, None),
    ("ls", 3, None),
    ("ir", 3, None),
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
    if mode in ("dp", "ir", "hybrid"):  # replicated: some block is trained on every replica at once
        replicas = max(stage["replicas"] for stage in stages) if stages else nproc
        assert max(len(draws) for draws in drawn.values()) == replicas


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


# The supernet's block profile on 2 ranks, measured once on a 2-core machine (`pipebd profile` of the spec
# below): auto plans from it as from a fresh measurement, without a profiling job each run. Measuring a
# search's blocks (arch rounds, each candidate's forward) is the held-out benchmark's (docs/benchmarks.md).
FROZEN_PROFILE = Path(__file__).parents[1] / "fixtures" / "nas_profile.json"


def test_auto_plans_and_runs_the_search(reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(nas_document(schedule={"mode": "auto", "nproc": 2, "profile": True}))
    monkeypatch.setenv(profiles.CACHE_ENV, str(tmp_path / "cache"))
    profiles.store(spec, Profile.from_json(json.loads(FROZEN_PROFILE.read_text())))
    code, run_dir = run_job(spec, tmp_path / "run")
    assert code == 0, run_dir.rank_errors()
    plan = run_dir.read_json(run_dir.plan)
    assert plan["search"] == {"from_step": 2, "every": 2} and plan["alternatives"]
    segments = plan["simulation"]["chosen"]["segments"]
    arch_steps = {s["step"] for s in segments if s["kind"] == "student" and s["round"] == "arch"}
    simulated = {s["step"] for s in segments}
    assert arch_steps == {step for step in simulated if (step + 1) % 2 == 0}  # steady state: every 2nd step
    assert_same_weights(load_students(run_dir), torch.load(reference / "student.pt", weights_only=True))
