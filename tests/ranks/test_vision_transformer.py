"""A vision transformer end to end: a tiny torchvision ViT trained here on digits (kind train), then that
teacher searched layer by layer under a parameter budget and fine-tuned with KD, each phase equal to its
definition written out.

Tier: two gloo jobs through the supervisor. The teacher: 2 ranks, a 1F1B pipeline of the embedding, the
four encoder layers and the head, against end-to-end cross-entropy written out (full batches, SGD with the
phase's cosine schedule); its teacher.pt is a torchvision state_dict a transformer job loads. The search:
3 ranks, a hybrid plan relaying layers 0-1's output to two replicas that split layers 2-3's rows, every
replacement a candidate, against the sequential loop; then a GPipe fine-tune of the chosen network against
end-to-end KD written out. Each replacement's start, and the refusals, are checked without ranks in
tests/unit/test_vision_transformer.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pipebd_core.rank.network import build_network, network_to_train, teacher_network
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from tests.helpers import assert_same_weights, end_to_end_training, load_students, plain_loop
from tests.transformer_specs import TINY_VIT, vit_document

SEARCH = ["keep", "ffn_1/4", "kv_1", "linear_attention", "no_attention", "linear", "noop"]
STAGES = [{"start": 0, "stop": 2, "replicas": 1}, {"start": 2, "stop": 4, "replicas": 2}]
ALPHA, TEMPERATURE = 0.3, 2.0


def cross_entropy(_images: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


@pytest.fixture(scope="module")
def teacher_spec() -> Spec:
    document = vit_document(schedule={"nproc": 2})
    document["workload"] = {"kind": "train", "config": TINY_VIT}
    document["finetune"] = {"strategy": "1f1b", "microbatches": 3, "max_steps": 4, "lr": 0.1, "profile": False}
    return parse_spec(document)


@pytest.fixture(scope="module")
def teacher_run(teacher_spec: Spec, finished_run: Callable[[Spec], RunDir]) -> RunDir:
    return finished_run(teacher_spec)


@pytest.fixture(scope="module")
def search_spec(teacher_run: RunDir) -> Spec:
    workload = {"config": TINY_VIT, "teacher_weights": str(teacher_run.teacher), "replacements": SEARCH}
    document = vit_document(workload={**workload, "budget": {"params": 0.5}})
    document["schedule"].update({"mode": "hybrid", "nproc": 3, "stages": STAGES})
    document["finetune"] = {
        "strategy": "gpipe",
        "loss": "kd",
        "alpha": ALPHA,
        "temperature": TEMPERATURE,
        "microbatches": 3,
        "max_steps": 3,
        "lr": 0.05,
        "profile": False,
    }
    return parse_spec(document)


def test_a_vision_transformer_trained_here_is_end_to_end_training_and_a_teacher_a_job_loads(
    teacher_spec: Spec, teacher_run: RunDir, search_spec: Spec
) -> None:
    plan = teacher_run.read_json(teacher_run.finetune_plan)
    assert plan["strategy"] == "1f1b" and len(plan["stages"]) == 2 and plan["input_dtype"] == "float32"
    trained = torch.load(teacher_run.teacher, map_location="cpu", weights_only=True)
    network = network_to_train(teacher_spec)
    assert_same_weights(trained, end_to_end_training(teacher_spec, network, cross_entropy))
    teacher = teacher_network(search_spec)  # teacher.pt as workload.teacher_weights: the same logits
    assert teacher is not None
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(teacher(images), network.eval()(images))


def test_a_relayed_and_split_search_of_the_trained_teacher_equals_the_plain_loop(
    search_spec: Spec, finished_run: Callable[[Spec], RunDir]
) -> None:
    run = finished_run(search_spec)
    assert_same_weights(load_students(run), plain_loop(search_spec))
    architecture = run.read_json(run.architecture)
    assert len(architecture["candidates"]) == 4 * len(SEARCH)
    assert architecture["budget"] == {"params": 0.5} and architecture["reached"]["params"] <= 0.5
    assert any(block["layers"] != ["keep"] for block in architecture["blocks"])
    names = {block["layers"][0] for block in architecture["blocks"]}  # mixed layers have no transformers form
    plain = len(names) == 1 and next(iter(names)).startswith(("keep", "ffn_"))
    assert run.searched_hf.exists() == plain  # (docs/transformers.md): the program below is their format
    network = torch.load(run.searched_model, weights_only=False)
    program = torch.export.load(run.distilled_export).module()  # batch-dynamic: another batch size
    images = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(program(images), network(images))
    summary = run.load_summary()  # digits have labels: top-1 of the searched network and of its teacher
    assert summary.student_top1 is not None and summary.teacher_top1 is not None


def test_the_searched_network_fine_tunes_with_kd_as_end_to_end_kd_written_out(
    search_spec: Spec, finished_run: Callable[[Spec], RunDir]
) -> None:
    run = finished_run(search_spec)
    plan = run.read_json(run.finetune_plan)
    assert plan["strategy"] == "gpipe" and len(plan["stages"]) == 3
    teacher = teacher_network(search_spec)
    assert teacher is not None

    def kd(images: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            p = (teacher(images) / TEMPERATURE).softmax(-1)
        log_q = (logits / TEMPERATURE).log_softmax(-1)
        kl = (p * (p.log() - log_q)).sum(-1).mean()
        return ALPHA * F.cross_entropy(logits, labels) + (1 - ALPHA) * TEMPERATURE**2 * kl

    expected = end_to_end_training(search_spec, build_network(search_spec, run).model, kd)
    trained = torch.load(run.finetuned_model, map_location="cpu", weights_only=True)
    assert_same_weights(trained, expected)
    report = run.load_summary().finetune
    assert report is not None and report.top1_after is not None and report.perplexity_after is None
