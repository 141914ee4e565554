"""The finetune phase of a transformer: a distilled tiny Llama trained end to end with KD on its logits,
and a Llama trained from scratch here (kind train) as the teacher a transformer job loads (checked by
`assert_trained_here_and_a_teacher` on the bundled teacher example's job, which tests/service/test_phases.py
runs anyway).

Tier: one 2-rank gloo job through the supervisor (tr_dpu distillation, then a zero-bubble pipeline of the
decoder layers, token ids entering stage 0), against end-to-end training written out here from the same
distilled weights: per-token KD (alpha x CE + (1 - alpha) x T^2 x KL of the softened teacher and student
next-token distributions), full batches, SGD with the phase's cosine schedule. The kd loss's algebra on
(batch, sequence, vocabulary) logits is checked without ranks in tests/unit/test_kd_losses.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipebd_core.data.text import BYTE_EOS, read_documents, tokenizer_of
from pipebd_core.job.steps import preflight
from pipebd_core.rank.metrics import perplexity
from pipebd_core.rank.network import build_network, teacher_network
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.transformer import language_model_to_train
from tests.helpers import assert_same_weights, end_to_end_training
from tests.transformer_specs import transformer_document

ALPHA, TEMPERATURE = 0.4, 2.0


def kd_finetune_spec(text_root: Path) -> Spec:
    """A compression of the tiny Llama (every FFN halved) on 2 ranks, then 3 steps of pipelined KD fine-tuning;
    its distill phase is test_hf_directories.py's plain Llama compression too (one run for both files)."""
    document = transformer_document(text_root, schedule={"nproc": 2})
    document["finetune"] = {
        "strategy": "zb",
        "loss": "kd",
        "alpha": ALPHA,
        "temperature": TEMPERATURE,
        "microbatches": 3,
        "epochs": 1,
        "max_steps": 3,
        "lr": 0.05,
        "profile": False,
    }
    return parse_spec(document)


@pytest.fixture(scope="module")
def spec(shared_text: Path) -> Spec:
    return kd_finetune_spec(shared_text)


def kd_training(spec: Spec, run_dir: RunDir) -> dict[str, torch.Tensor]:
    """The distilled network of `run_dir` trained end to end with per-token KD, written out."""
    teacher = teacher_network(spec)
    assert teacher is not None

    def kd(ids: torch.Tensor, logits: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:  # logits (B, T, V)
        with torch.no_grad():
            p = (teacher(ids) / TEMPERATURE).softmax(-1)
        log_q = (logits / TEMPERATURE).log_softmax(-1)
        per_token_kl = (p * (p.log() - log_q)).sum(-1)  # (batch, sequence)
        return (
            ALPHA * next_token_cross_entropy(ids, logits, next_ids) + (1 - ALPHA) * TEMPERATURE**2 * per_token_kl.mean()
        )

    network = build_network(spec, run_dir).model  # the distilled students, embedding and head frozen
    return end_to_end_training(spec, network, kd)


def test_a_pipelined_kd_finetune_trains_what_end_to_end_kd_trains(
    spec: Spec, finished_run: Callable[[Spec], RunDir]
) -> None:
    run_dir = finished_run(spec)
    plan = run_dir.read_json(run_dir.finetune_plan)
    assert plan["strategy"] == "zb" and len(plan["stages"]) == 2 and plan["input_dtype"] == "int64"
    trained = torch.load(run_dir.finetuned_model, map_location="cpu", weights_only=True)
    expected = kd_training(spec, run_dir)
    assert_same_weights(trained, expected)
    distilled = build_network(spec, run_dir).model.state_dict()
    assert any(not torch.equal(trained[key], value) for key, value in distilled.items())  # it did train


def test_evaluate_reports_perplexity_before_and_after_and_the_teachers(
    spec: Spec, finished_run: Callable[[Spec], RunDir]
) -> None:
    run_dir = finished_run(spec)  # the run above: no new launch
    report = run_dir.load_summary().finetune
    assert report is not None and report.top1_after is None
    network = build_network(spec, run_dir).model
    before = perplexity(network, spec, torch.device("cpu"))
    network.load_state_dict(torch.load(run_dir.finetuned_model, map_location="cpu", weights_only=True))
    after = perplexity(network, spec, torch.device("cpu"))
    teacher = teacher_network(spec)
    assert teacher is not None
    assert report.perplexity_before == pytest.approx(before, rel=1e-6) and before != pytest.approx(after, rel=1e-6)
    assert report.perplexity_after == pytest.approx(after, rel=1e-6)
    assert report.teacher_perplexity == pytest.approx(perplexity(teacher, spec, torch.device("cpu")), rel=1e-6)
    lines = [json.loads(line) for line in run_dir.metrics(0, "finetune").read_text().splitlines()]
    evaluations = [line for line in lines if line.get("eval")]
    assert evaluations and evaluations[-1]["perplexity"] == pytest.approx(after, rel=1e-6)
    program = torch.export.load(run_dir.exported_model).module()  # token ids of another batch and length
    ids = torch.randint(0, 257, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(program(ids), network.eval()(ids))


def test_a_transformer_search_fine_tunes_from_its_distilled_layers_only(spec: Spec) -> None:
    """Refused before launch: a search started from scratch (its layers come from the teacher's weights)."""
    document = json.loads(spec.model_dump_json(exclude_none=True))
    document["workload"]["replacements"] = ["keep", "ffn_1/2"]
    document["workload"]["budget"] = {"params": 0.9}
    document["finetune"]["init"] = "scratch"
    with pytest.raises(SpecError, match=r"finetune\.init: 'scratch' of a transformer search is not supported"):
        preflight(parse_spec(document))
    document["finetune"]["init"] = "distilled"
    preflight(parse_spec(document))  # the first candidates' shapes stand in for the search's until it has run


def next_token_cross_entropy(ids: torch.Tensor, logits: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), next_ids.reshape(-1))


def assert_trained_here_and_a_teacher(run_dir: RunDir) -> None:
    """A language model trained here (kind train; tests/service/test_phases.py passes the bundled
    tiny-llama-teacher.yaml's 2-rank job, which the next example job of its chain distils) is end-to-end
    training with next-token cross-entropy, reports its perplexity as the teacher's (lower than before), and
    teacher_model/ is a directory a transformer job loads as its teacher: it passes preflight, computes the
    trained network's logits, and carries the data's tokenizer."""
    teacher_spec = run_dir.load_spec()
    trained = torch.load(run_dir.finetuned_model, map_location="cpu", weights_only=True)
    network = language_model_to_train(teacher_spec)
    expected = end_to_end_training(teacher_spec, network, next_token_cross_entropy)
    assert_same_weights(trained, expected)
    report = run_dir.load_summary().finetune
    assert report is not None and report.top1_after is None and report.perplexity_after is not None
    assert report.teacher_perplexity == report.perplexity_after < report.perplexity_before
    compress = json.loads(teacher_spec.model_dump_json(exclude_none=True))
    del compress["finetune"]
    compress["workload"] = {"kind": "transformer", "teacher": str(run_dir.teacher_model), "replacements": ["ffn_1/2"]}
    compress_spec = parse_spec(compress)
    preflight(compress_spec)  # a model directory of a supported family: config.json and safetensors
    teacher = teacher_network(compress_spec)
    assert teacher is not None
    network.load_state_dict(trained)
    ids = torch.randint(0, 257, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(teacher(ids), network.eval()(ids))
    assert_carries_the_data_s_tokenizer(run_dir.teacher_model, teacher_spec)


def assert_carries_the_data_s_tokenizer(folder: Path, spec: Spec) -> None:
    """AutoTokenizer loads `folder` and gives the ids the job's data was encoded with; generation_config.json
    ends a document where the data does (the byte-level 256, not the Llama config's 2)."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert spec.data.root is not None and not spec.data.tokenizer  # the byte-level default
    text = read_documents(Path(spec.data.root))[0] + " ¿sí? 🙂"
    assert tokenizer(text)["input_ids"] == tokenizer_of(spec).encode(text) == list(text.encode("utf-8"))
    generation = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    assert tokenizer.eos_token_id == generation.eos_token_id == generation.pad_token_id == BYTE_EOS
    assert generation.bos_token_id is None
