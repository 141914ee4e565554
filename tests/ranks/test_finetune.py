"""The finetune phase: every strategy trains exactly what plain full-batch training trains.

Tier: 1-3 rank gloo runs of a kind `train` job (a small BN-free classifier on scikit-learn's digits)
through the supervisor, against a full-batch loop written here (the equivalence runs stop after the finetune
phase, their weights read from its last checkpoints as evaluate reads them); the split backward of zb, its
TensorBoard series, refusals before launch, a failing rank, and a torchvision teacher trained here and
distilled from (resume, on another rank count, and training on two nodes: tests/ranks/test_multinode.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.phases import FINETUNE
from pipebd_core.job.steps import preflight
from pipebd_core.planning import profiles
from pipebd_core.rank.deferred import defer_weight_gradients
from pipebd_core.rank.network import build_network
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec
from tests.helpers import assert_same_weights, checkpointed_finetune, end_to_end_training, run_job


def e2e_document(strategy: str, nproc: int, **finetune: Any) -> dict[str, Any]:
    """A 4-block BN-free classifier (11 layers) on 8x8 digits: 3 steps of a 12-sample batch, seconds."""
    return {
        "name": f"e2e-{strategy}-{nproc}",
        "workload": {"kind": "train", "factory": "pipebd_core.workloads.tiny:make_network", "options": {}},
        "data": {"dataset": "digits", "image_size": 8, "batch_size": 12, "eval_samples": 60},
        "train": {"seed": 3},
        "schedule": {"nproc": nproc, "profile": False},
        "finetune": {
            "strategy": strategy,
            "microbatches": 4,
            "epochs": 1,
            "max_steps": 3,
            "lr": 0.2,
            "profile": False,
            **finetune,
        },
    }


def full_batch_training(spec: Spec) -> dict[str, torch.Tensor]:
    """End-to-end training written out: the definition every strategy must meet."""
    network = build_network(spec, None).model
    return end_to_end_training(spec, network, lambda inputs, logits, labels: F.cross_entropy(logits, labels))


def trained(run_dir: RunDir) -> dict[str, torch.Tensor]:
    return torch.load(run_dir.finetuned_model, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return full_batch_training(parse_spec(e2e_document("ddp", 1)))


CASES = [("ddp", 2), ("gpipe", 2), ("1f1b", 2), ("zb", 2), ("zb", 3)]


@pytest.mark.parametrize(("strategy", "nproc"), CASES, ids=[f"{s}-{n}" for s, n in CASES])
def test_every_strategy_trains_what_full_batch_training_trains(
    strategy: str, nproc: int, reference: dict[str, torch.Tensor], finished_run: Callable[..., RunDir]
) -> None:
    run_dir = finished_run(parse_spec(e2e_document(strategy, nproc)), until=FINETUNE)
    assert_same_weights(checkpointed_finetune(run_dir), reference)
    plan = run_dir.read_json(run_dir.finetune_plan)
    assert plan["strategy"] == strategy and len(plan["stages"]) == (1 if strategy == "ddp" else nproc)


def test_ddp_with_batchnorm_and_shards_of_unequal_size_trains_the_full_batch(
    finished_run: Callable[..., RunDir],
) -> None:
    document = e2e_document("ddp", 3)
    document["data"]["batch_size"] = 10  # shards of 4, 3 and 3 rows
    document["workload"]["options"] = {"batch_norm": True}  # normalised over the whole batch: cross-rank
    spec = parse_spec(document)
    weights = checkpointed_finetune(finished_run(spec, until=FINETUNE))
    assert any(key.endswith("running_var") for key in weights)
    assert_same_weights(weights, full_batch_training(spec))


def timeline(run_dir: RunDir, rank: int) -> list[list[Any]]:
    lines = [json.loads(line) for line in run_dir.metrics(rank, "finetune").read_text().splitlines()]
    return [line["timeline"] for line in lines if "timeline" in line]


def test_zb_ran_input_and_weight_gradients_apart(finished_run: Callable[..., RunDir]) -> None:
    run_dir = finished_run(parse_spec(e2e_document("zb", 2)), until=FINETUNE)  # the equivalence test's run
    for rank in (0, 1):
        for steps in timeline(run_dir, rank):
            kinds = [(kind, mb) for kind, mb, _, _ in steps if kind in ("F", "B", "I", "W")]
            assert not any(kind == "B" for kind, _ in kinds)  # no full backward at all
            for mb in range(4):
                assert kinds.index(("I", mb)) < kinds.index(("W", mb))  # every W after its own I
            w_runs = [(start, end) for kind, _, start, end in steps if kind == "W"]
            assert sum(end - start for start, end in w_runs) > 0
    lines = [json.loads(line) for line in run_dir.metrics(0, "finetune").read_text().splitlines()]
    assert [line["w_calls"] for line in lines if "w_calls" in line] == [4, 8, 12]  # one batched W per W action


def test_the_finetune_phase_is_in_tensorboard_loss_per_step_and_top1(finished_run: Callable[..., RunDir]) -> None:
    run_dir = finished_run(parse_spec(e2e_document("zb", 2)), until=FINETUNE)  # the run above: no new launch
    events = EventAccumulator(str(run_dir.tensorboard("finetune")))
    events.Reload()
    last_stage = [json.loads(line) for line in run_dir.metrics(1, "finetune").read_text().splitlines()]
    losses = {line["step"]: line["loss"] for line in last_stage}
    assert {event.step: event.value for event in events.Scalars("finetune/loss")} == pytest.approx(losses)
    evaluations = [json.loads(line) for line in run_dir.metrics(0, "finetune").read_text().splitlines()]
    top1 = {line["step"]: line["top1"] for line in evaluations if line.get("eval")}
    assert top1 and {event.step: event.value for event in events.Scalars("finetune/top1")} == pytest.approx(top1)
    assert {"finetune/train_acc", "finetune/samples_per_s", "finetune/peak_mib/rank_0"} <= set(events.Tags()["scalars"])


def test_the_input_pass_leaves_weight_gradients_for_the_weight_pass() -> None:
    torch.manual_seed(0)
    network = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=1, groups=6),
        nn.Flatten(),
        nn.Linear(6 * 16, 4),
    )
    reference = nn.Sequential(*[layer for layer in network])  # the same modules, to compare gradients first
    inputs = [torch.randn(2, 3, 4, 4, requires_grad=True) for _ in range(3)]
    expected_inputs = []
    for x in inputs:
        y = reference(x)
        (grad,) = torch.autograd.grad(y.square().sum(), x, retain_graph=True)
        expected_inputs.append(grad)
        y.square().sum().backward()
    expected = {name: p.grad.clone() for name, p in network.named_parameters()}
    network.zero_grad(set_to_none=True)
    weights = defer_weight_gradients(network)
    for x, expected_input in zip(inputs, expected_inputs, strict=True):
        x.grad = None
        network(x).square().sum().backward()
        torch.testing.assert_close(x.grad, expected_input)  # the input gradient is exact at once
    assert all(p.grad is None for p in network.parameters()) and weights.pending() == 3
    weights.run()  # one batched call per layer for the three micro-batches
    assert weights.calls == 1 and weights.pending() == 0
    for name, p in network.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6)
    weights.restore()
    assert "forward" not in network[0].__dict__


@pytest.mark.parametrize(
    ("finetune", "schedule", "message"),
    [
        ({"microbatches": 5}, {}, "finetune.microbatches: a batch of 12 does not split into 5 equal micro-batches"),
        ({"strategy": "1f1b", "microbatches": 2}, {"nproc": 3}, "1f1b on 3 stages needs at least 3 micro-batches"),
        ({"strategy": "gpipe", "microbatches": 12}, {"nproc": 12}, "12 pipeline stages need at least 12 layers"),
        ({"strategy": "gpipe", "stages": [0, 20]}, {"nproc": 2}, "finetune.stages: stage starts [0, 20] reach past"),
        (
            {"strategy": "ddp", "stages": [0, 4]},
            {"nproc": 2},
            "finetune.stages: strategy 'ddp' keeps the whole network",
        ),
        ({"strategy": "auto", "profile": False}, {}, "finetune.profile: strategy 'auto' plans from measured layer"),
    ],
)
def test_bad_combinations_are_refused_before_launch(
    finetune: dict[str, Any], schedule: dict[str, Any], message: str
) -> None:
    document = e2e_document("gpipe", 2)
    document["finetune"].update(finetune)
    document["schedule"].update(schedule)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        preflight(parse_spec(document))


def test_cross_entropy_on_a_data_set_without_labels_is_refused() -> None:
    document = e2e_document("ddp", 1)
    document["data"].update(dataset="custom", factory="tests.unit.test_data:make_dataset", options={"count": 24})
    with pytest.raises(SpecError, match=re.escape("finetune.loss: 'ce' trains to the labels, but the custom data")):
        preflight(parse_spec(document))


def test_a_failing_rank_fails_the_finetune_phase_with_its_traceback(tmp_path: Path) -> None:
    code, run_dir = run_job(parse_spec(e2e_document("gpipe", 2)), tmp_path / "run", env={"PIPEBD_INJECT_FAULT": "1:1"})
    assert code != 0
    errors = run_dir.rank_errors("finetune")
    assert errors[0].rank == 1 and "injected fault on rank 1 at finetune step 1" in errors[0].message
    phases = {record.name: record for record in run_dir.load_phases()}
    assert phases["finetune"].outcome == "failed" and phases["finetune"].reason == "rank_error"


# The layer profile of e2e_document("auto", 2, profile=True), measured once on a 2-core machine: auto
# ranks the strategies from it as from a fresh measurement, without a profiling job each run. That the
# layer profiler measures (every layer, both ranks at once for the co-run curve) is checked on the layer
# profile the Chromium finetune test's job measures (tests/web/test_browser.py), the same network's.
FROZEN_LAYER_PROFILE = Path(__file__).parents[1] / "fixtures" / "finetune_layer_profile.json"


def test_auto_ranks_every_strategy_from_the_layer_profile_and_trains_the_same(
    reference: dict[str, torch.Tensor],
    finished_run: Callable[[Spec], RunDir],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = parse_spec(e2e_document("auto", 2, profile=True))
    frozen = LayerProfile.from_json(json.loads(FROZEN_LAYER_PROFILE.read_text()))
    monkeypatch.setenv(profiles.CACHE_ENV, str(tmp_path / "cache"))
    profiles.store(spec, frozen)
    run_dir = finished_run(spec)
    plan = run_dir.read_json(run_dir.finetune_plan)
    ranked = plan["strategies"]
    assert next(entry["strategy"] for entry in ranked if entry["fits"]) == plan["strategy"]
    assert {entry["strategy"] for entry in ranked} == {"ddp", "gpipe", "1f1b", "zb"}
    assert all(entry["step_s"] > 0 and len(entry["bubble"]) == 2 for entry in ranked)
    assert plan["predicted_step_s"] == ranked[0]["step_s"]
    assert_same_weights(trained(run_dir), reference)
    assert run_dir.load_layer_profile() == frozen  # planned from the cached profile, not a new measurement


def test_a_trained_vgg11_is_a_torchvision_teacher_a_compression_job_takes(tmp_path: Path) -> None:
    import torchvision

    document = {
        "name": "teacher",
        "workload": {"kind": "train", "teacher": "vgg11"},
        "data": {"dataset": "digits", "image_size": 32, "batch_size": 8, "eval_samples": 16},
        "schedule": {"nproc": 1, "profile": False},
        "finetune": {"strategy": "ddp", "max_steps": 1, "lr": 0.01, "profile": False},
    }
    code, run_dir = run_job(parse_spec(document), tmp_path / "run")
    assert code == 0, run_dir.events.read_text()[-2000:]
    teacher = torchvision.models.vgg11(num_classes=10)
    teacher.load_state_dict(torch.load(run_dir.teacher, weights_only=True), strict=True)
    summary = run_dir.read_json(run_dir.summary)["finetune"]
    assert summary["teacher_top1"] == summary["top1_after"] and summary["student"]["params"] == 128_807_306
    exported = torch.export.load(run_dir.exported_model).module()  # no PipeBD class needed to run it
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(exported(x), teacher.eval()(x), rtol=1e-4, atol=1e-5)
    compress = {
        "workload": {"kind": "compression", "teacher": "vgg11", "teacher_weights": str(run_dir.teacher)},
        "data": {"dataset": "digits", "image_size": 32, "batch_size": 8},
        "schedule": {"nproc": 1, "profile": False},
    }
    preflight(parse_spec(compress))  # accepted as it is: every key and shape checked
