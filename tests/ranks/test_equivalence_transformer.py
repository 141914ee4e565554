"""A transformer workload trains exactly what the sequential loop trains whatever the mode: a tiny random
Llama (RMSNorm, rotary embeddings, grouped KV heads) with hidden states relayed between ranks and rows
split; a tiny GPT-2 (LayerNorm, learned positions, fused QKV) data-parallel, every rank re-running the
teacher from the token ids; a tiny vision transformer (LayerNorm, bidirectional attention, a class
token) in layerwise scheduling, every rank loading the whole batch of images.

Tier: gloo runs on CPU through torchrun: a 3-rank hybrid plan that relays and splits in one job, a search
over every replacement with normalised MSE; a 2-rank dp and a 2-rank ls search with cosine and MSE block
losses; a 2-rank compression in ir (Llama) and in tr (GPT-2). tr_dpu is hybrid without replicas; auto runs
the plan it chooses as hybrid. A ViT's hybrid search and fine-tuning are in
tests/ranks/test_vision_transformer.py; every mode's task order at one rank is checked without ranks in
tests/unit/test_schedule.py; the compressed network's perplexity in tests/unit/test_transformer_workload.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pipebd_core.documents.phases import DISTILL
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from pipebd_core.workloads.workload import build_workload
from tests.helpers import assert_same_weights, checkpointed_students, load_students, plain_loop
from tests.transformer_specs import TINY_GPT2, TINY_LLAMA, TINY_VIT, transformer_document, vit_document, write_text

SEARCH = ["keep", "ffn_1/4", "kv_1", "linear_attention", "no_attention", "linear", "noop"]
GPT2_SEARCH = ["keep", "ffn_1/2", "linear_attention", "no_attention"]  # GPT-2 has no separate KV heads
# rank 0 relays layers 0-1's output to ranks 1 and 2, which split the 9 rows of layers 2-3 (5 + 4)
STAGES = [{"start": 0, "stop": 2, "replicas": 1}, {"start": 2, "stop": 4, "replicas": 2}]


@pytest.fixture(scope="module")
def text_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("text"))


def test_a_relayed_and_split_search_equals_the_plain_loop(
    text_root: Path, finished_run: Callable[[Spec], RunDir]
) -> None:
    document = transformer_document(text_root, train={"loss": "nmse"})
    document["workload"]["replacements"] = SEARCH
    document["schedule"].update({"mode": "hybrid", "nproc": 3, "stages": STAGES})
    spec = parse_spec(document)
    run = finished_run(spec)
    trained = load_students(run)
    assert_same_weights(trained, plain_loop(spec))
    initial = build_workload(spec).student_blocks[2].state_dict()
    assert any(not torch.equal(trained[f"blocks.2.{key}"], value) for key, value in initial.items())
    architecture = run.read_json(run.architecture)  # every candidate of every layer measured, one chosen
    assert [len(block["layers"]) for block in architecture["blocks"]] == [1, 1, 1, 1]
    assert sorted({c["name"] for c in architecture["candidates"]}) == sorted(SEARCH)
    assert len(architecture["candidates"]) == 4 * len(SEARCH)
    network = torch.load(run.searched_model, weights_only=False)
    assert network(torch.zeros((2, 8), dtype=torch.long)).shape == (2, 8, 260)
    program = torch.export.load(run.distilled_export).module()  # finalize's export, alone, at another length
    ids = torch.randint(0, 257, (3, 6))
    with torch.no_grad():
        torch.testing.assert_close(program(ids), network(ids))
    summary = run.load_summary()  # the searched network's held-out perplexity, beside its teacher's
    assert summary.student_perplexity is not None and summary.teacher_perplexity is not None
    assert summary.teacher_perplexity > 1 and summary.student_perplexity > 1


def test_a_data_parallel_gpt2_search_equals_the_plain_loop(
    text_root: Path, finished_run: Callable[[Spec], RunDir]
) -> None:
    document = transformer_document(text_root, train={"loss": "cosine"}, schedule={"mode": "dp", "nproc": 2})
    document["workload"] = {"kind": "transformer", "config": TINY_GPT2, "replacements": GPT2_SEARCH}
    spec = parse_spec(document)
    run = finished_run(spec)
    assert_same_weights(load_students(run), plain_loop(spec))
    assert run.read_json(run.plan)["mode"] == "dp"
    network = torch.load(run.searched_model, weights_only=False)
    assert network(torch.zeros((2, 8), dtype=torch.long)).shape == (2, 8, 260)


def test_a_layerwise_scheduled_vit_search_equals_the_plain_loop(finished_run: Callable[..., RunDir]) -> None:
    document = vit_document(schedule={"mode": "ls", "nproc": 2})
    document["workload"] = {"kind": "transformer", "config": TINY_VIT, "replacements": ["ffn_1/2", "kv_2", "linear"]}
    spec = parse_spec(document)
    run = finished_run(spec, until=DISTILL)  # the students from the checkpoints: no finalize process
    assert_same_weights(checkpointed_students(run), plain_loop(spec))
    plan = run.read_json(run.plan)
    assert plan["mode"] == "ls" and sorted(b for blocks in plan["assignment"] for b in blocks) == [0, 1, 2, 3]
    assert all(plan["assignment"])  # both ranks train blocks


@pytest.mark.parametrize(("config", "mode"), [(TINY_LLAMA, "ir"), (TINY_GPT2, "tr")], ids=["llama-ir", "gpt2-tr"])
def test_a_compression_in_internal_or_teacher_relaying_equals_the_plain_loop(
    config: dict[str, object], mode: str, text_root: Path, finished_run: Callable[..., RunDir]
) -> None:
    document = transformer_document(text_root, schedule={"mode": mode, "nproc": 2})
    document["workload"]["config"] = config
    spec = parse_spec(document)
    run = finished_run(spec, until=DISTILL)  # the students from the checkpoints: no finalize process
    assert_same_weights(checkpointed_students(run), plain_loop(spec))
    assert run.read_json(run.plan)["mode"] == mode
