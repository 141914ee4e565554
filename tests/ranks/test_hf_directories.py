"""Every language model a job makes is a Hugging Face model directory that `transformers` runs as the job's
own network: the plain compressions of a tiny Llama, Qwen2 and GPT-2 (the teacher's model_type, no remote
code), a budgeted Llama search and its fine-tuning (PipeBD's remote code), and every replacement kind in
each family's remote code (networks rebuilt from hand-picked architectures, no job).

Oracles: the job's network as PipeBD rebuilds it (`rebuild` with distilled_state.pt, or the fine-tuned
state_dict in `build_network`), its logits on held-out tokens, and a greedy loop over it written here;
`generate` with and without the cache; and PipeBD's byte-level token ids (data/text.py).

Tier: four 1-rank gloo jobs and test_finetune_transformer.py's 2-rank one (the Llama compression) through the
supervisor (finished_run, on the session's `shared_text`), and one `python -I` subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipebd_core.data.text import ByteTokenizer
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
from pipebd_core.rank.network import build_network
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, parse_spec
from pipebd_core.workloads.hf_directory import write_model_directory
from pipebd_core.workloads.replacements import FFNOnly
from pipebd_core.workloads.transformer import DecoderBlock, build_transformer_workload, held_out_ids, rebuild
from tests.ranks.test_finetune_transformer import kd_finetune_spec
from tests.transformer_specs import TINY_GPT2, TINY_LLAMA, TINY_QWEN2, llama_search_document, transformer_document

GPT2_KINDS = ["keep", "ffn_1/2", "linear_attention", "no_attention", "linear", "noop"]  # no separate KV heads
NEW_TOKENS = 6


@pytest.fixture(autouse=True, scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Remote code is copied into HF_MODULES_CACHE on load: a folder of this test module, not ~/.cache."""
    os.environ.setdefault("HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf-modules")))


def compression(text_root: Path, config: dict[str, Any], replacement: str) -> Spec:
    """A 2-step compression of `config` by `replacement`; the Llama's by ffn_1/2 is test_finetune_transformer.py's
    job (its distill phase is that compression, 3 steps on 2 ranks, fine-tuned after): one run for both files."""
    if config == TINY_LLAMA and replacement == "ffn_1/2":
        return kd_finetune_spec(text_root)
    document = transformer_document(text_root, train={"max_steps": 2})
    document["workload"] = {"kind": "transformer", "config": config, "replacements": [replacement]}
    return parse_spec(document)


@pytest.fixture(scope="module")
def search(shared_text: Path, finished_run: Callable[[Spec], RunDir]) -> tuple[Spec, RunDir]:
    """A Llama search over every replacement within half the parameters and a fifth of the KV cache, then
    two steps of fine-tuning."""
    spec = parse_spec(llama_search_document(shared_text))
    return spec, finished_run(spec)


def load(folder: Path, remote: bool) -> Any:
    from transformers import AutoModelForCausalLM

    config = json.loads((folder / "config.json").read_text())
    assert ("auto_map" in config) == remote and (config["model_type"] == "pipebd") == remote
    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=remote, local_files_only=True)
    return model.eval()


def greedy_loop(network: nn.Module, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat((ids, network(ids)[:, -1:].argmax(-1)), dim=1)
    return ids


def assert_runs_as(model: Any, network: nn.Module, ids: torch.Tensor) -> None:
    """Same logits as the job's network (1e-5), greedy generation the same with and without the cache and
    as a greedy loop over the network, sampling the same with and without the cache."""
    network.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, network(ids), atol=1e-5, rtol=1e-5)
    prompt = ids[:2, :4]
    cached = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached) and torch.equal(cached, greedy_loop(network, prompt, NEW_TOKENS))
    sampled = []
    for use_cache in (True, False):
        torch.manual_seed(7)
        sampled.append(model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, use_cache=use_cache))
    assert torch.equal(*sampled) and sampled[0].shape == (2, 4 + NEW_TOKENS)


def assert_decodes_one_token_at_a_time(model: Any, ids: torch.Tensor) -> None:
    """With the cache a step takes the new token alone and gives the full forward's logits; kv_N layers keep
    N heads of keys, linear attention a state of fixed size, attention-free layers nothing."""
    with torch.no_grad():
        full = model(ids[:, :6]).logits
        prefill = model(ids[:, :5], use_cache=True)
        step = model(ids[:, 5:6], cache=prefill.cache, use_cache=True)
    torch.testing.assert_close(step.logits[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
    cache = step.cache
    assert cache.get_seq_length() == 6
    for index, block in enumerate(model.config.block_configs):
        keeps_keys = block["kind"] == "decoder" and block["attention"] == "softmax"
        assert (index in cache.keys) == keeps_keys and (index in cache.states) == (block.get("attention") == "linear")
        if keeps_keys:
            assert cache.keys[index].shape == (ids.shape[0], block["num_key_value_heads"], 6, model.config.head_dim)
        if index in cache.states:
            assert cache.states[index][0].shape[2] == 2 * model.config.head_dim  # Hedgehog: 2 x head_dim features


def job_network(spec: Spec, run: RunDir, architecture: Architecture | None) -> nn.Module:
    network = rebuild(spec, architecture)
    network.load_state_dict(torch.load(run.distilled_state, map_location="cpu", weights_only=True))
    return network


@pytest.mark.parametrize(
    ("config", "replacement", "changed"),
    [
        (TINY_LLAMA, "ffn_1/2", {"intermediate_size": 16}),
        (TINY_QWEN2, "kv_1", {"num_key_value_heads": 1}),
        (TINY_GPT2, "ffn_1/2", {"n_inner": 32}),
    ],
    ids=["llama-ffn", "qwen2-kv", "gpt2-ffn"],
)
def test_a_plain_compression_loads_as_its_teachers_family_without_remote_code(
    config: dict[str, Any],
    replacement: str,
    changed: dict[str, int],
    shared_text: Path,
    finished_run: Callable[[Spec], RunDir],
) -> None:
    spec = compression(shared_text, config, replacement)
    run = finished_run(spec)
    folder = run.distilled_hf
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == config["model_type"] and written.items() >= changed.items()
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 256 and generation.get("bos_token_id") is None
    assert sorted(p.name for p in folder.glob("*.py")) == []
    assert_runs_as(load(folder, remote=False), job_network(spec, run, None), held_out_ids(spec))


def test_a_budgeted_search_loads_with_its_own_code_and_generates_with_its_cache(
    search: tuple[Spec, RunDir],
) -> None:
    spec, run = search
    architecture = Architecture.from_json(run.read_json(run.architecture))
    names = [block.layers[0] for block in architecture.blocks]
    assert len(set(names)) > 1, f"the budget should force different choices, got {names}"
    model = load(run.searched_hf, remote=True)
    assert [block["replacement"] for block in model.config.block_configs] == names
    assert model.config.pipebd_version == "2"
    ids = held_out_ids(spec)
    assert_runs_as(model, job_network(spec, run, architecture), ids)
    assert_decodes_one_token_at_a_time(model, ids[:2])


def test_the_fine_tuned_network_is_a_directory_too(search: tuple[Spec, RunDir]) -> None:
    spec, run = search
    network = build_network(spec, run).model
    network.load_state_dict(torch.load(run.finetuned_model, map_location="cpu", weights_only=True))
    model = load(run.finetuned_hf, remote=True)
    assert_runs_as(model, network, held_out_ids(spec))
    distilled = load(run.searched_hf, remote=True)
    with torch.no_grad():  # it did train: not the searched network's logits
        assert not torch.allclose(model(held_out_ids(spec)).logits, distilled(held_out_ids(spec)).logits)


def test_the_tokenizer_gives_pipebds_ids(search: tuple[Spec, RunDir]) -> None:
    from transformers import AutoTokenizer

    _, run = search
    tokenizer = AutoTokenizer.from_pretrained(str(run.searched_hf), trust_remote_code=True, local_files_only=True)
    text = "Blockwise distillation, ¿sí? 🙂\n<|endoftext|> is text here"
    assert tokenizer(text)["input_ids"] == ByteTokenizer().encode(text)
    assert tokenizer.eos_token_id == 256 and tokenizer.decode(ByteTokenizer().encode(text)) == text


@pytest.mark.parametrize(
    ("config", "names"),
    [
        (TINY_LLAMA, ["linear_attention", "kv_1", "no_attention", "ffn_1/4"]),
        ({**TINY_QWEN2, "num_hidden_layers": 4}, ["noop", "linear_attention", "linear", "kv_1"]),
        ({**TINY_GPT2, "n_layer": 4}, ["linear_attention", "no_attention", "ffn_1/2", "noop"]),
        ({**TINY_GPT2, "n_layer": 2}, ["keep", "linear"]),
    ],
    ids=["llama", "qwen2", "gpt2", "gpt2-linear"],
)
def test_every_replacement_kind_runs_in_the_remote_code(
    config: dict[str, Any], names: list[str], shared_text: Path, tmp_path: Path
) -> None:
    kinds = ["keep", *sorted(set(names) - {"keep"})]  # a search of these: rebuilt from the chosen names
    document = transformer_document(shared_text)
    document["workload"] = {"kind": "transformer", "config": config, "replacements": kinds}
    spec = parse_spec(document)
    blocks = [ArchitectureBlock(block=i, layers=[name], loss=0.0, params=0) for i, name in enumerate(names)]
    architecture = Architecture(blocks=blocks, candidates=[], chosen_by="this test", teacher_params=0)
    network = rebuild(spec, architecture)
    torch.manual_seed(0)
    with torch.no_grad():  # trained-looking weights: feature maps and the linear map away from the identity
        for name, parameter in network.named_parameters():
            if name.endswith(("query_map.weight", "key_map.weight")) or parameter.shape == (16, 16):
                parameter.add_(0.1 * torch.randn_like(parameter))
    write_model_directory(spec, network, names, tmp_path / "model")
    model = load(tmp_path / "model", remote=True)
    ids = held_out_ids(spec)
    assert_runs_as(model, network, ids)
    assert_decodes_one_token_at_a_time(model, ids[:2])
    assert_is_a_teacher(tmp_path / "model", model, shared_text, tmp_path / "again")


KIND_MODULES = {"decoder": DecoderBlock, "ffn_only": FFNOnly, "linear": nn.Linear, "noop": nn.Identity}


def blocks_of(folder: Path) -> list[dict[str, Any]]:
    """config.json's block descriptions without the replacement each came from, and without its no-op layers
    (which compute nothing: a job that takes the directory as its teacher drops them)."""
    blocks = json.loads((folder / "config.json").read_text())["block_configs"]
    return [
        {key: value for key, value in block.items() if key != "replacement"}
        for block in blocks
        if block["kind"] != "noop"
    ]


def assert_is_a_teacher(folder: Path, model: Any, text_root: Path, again: Path) -> None:
    """The directory as a transformer job's teacher (PipeBD's own modeling code, no trust_remote_code): one
    teacher block per block description but the no-ops, of its kind, computing the directory's logits; every
    layer kept, the job's network is written back as the same layers."""
    document = transformer_document(text_root)
    document["workload"] = {"kind": "transformer", "teacher": str(folder), "replacements": ["keep", "ffn_1/2", "noop"]}
    spec = parse_spec(document)
    workload = build_transformer_workload(spec)
    teacher = workload.teacher_network()
    assert isinstance(teacher, nn.Sequential)
    layers = [teacher[0][1], *list(teacher)[1:-1]]
    descriptions = [block for block in model.config.block_configs if block["kind"] != "noop"]
    kinds = [block["kind"] for block in descriptions]
    assert [type(layer) for layer in layers] == [KIND_MODULES[kind] for kind in kinds]
    for kind, block, student in zip(kinds, descriptions, workload.student_blocks, strict=True):
        narrowed = student.options[1]  # ffn_1/2: an FFN halved where the layer has one, else the layer as it is
        assert isinstance(narrowed, KIND_MODULES[kind]) and isinstance(student.options[2], nn.Identity)
        if kind == "ffn_only":
            width = narrowed.mlp.c_fc.nf if hasattr(narrowed.mlp, "c_fc") else narrowed.mlp.gate_proj.out_features
            assert width == block["intermediate_size"] // 2
    ids = held_out_ids(spec)
    with torch.no_grad():
        torch.testing.assert_close(teacher(ids), model(ids).logits, atol=1e-5, rtol=1e-5)
    keep = [ArchitectureBlock(block=i, layers=["keep"], loss=0.0, params=0) for i in range(len(kinds))]
    kept = rebuild(spec, Architecture(blocks=keep, candidates=[], chosen_by="this test", teacher_params=0))
    write_model_directory(spec, kept, ["keep"] * len(kinds), again)
    assert blocks_of(again) == blocks_of(folder)


def test_a_search_is_the_next_jobs_teacher_and_the_network_it_fine_tunes(
    search: tuple[Spec, RunDir], shared_text: Path, finished_run: Callable[[Spec], RunDir]
) -> None:
    """Search -> fine-tune the searched architecture: a job whose teacher is searched_hf/, every layer kept
    (the searched weights), trained end to end; its directories are the searched layers again."""
    _, run = search
    document = transformer_document(shared_text, train={"max_steps": 2, "weight_decay": 0.0})
    document["workload"] = {"kind": "transformer", "teacher": str(run.searched_hf), "replacements": ["keep"]}
    document["finetune"] = {"strategy": "ddp", "epochs": 1, "max_steps": 2, "lr": 0.05, "profile": False}
    spec = parse_spec(document)
    tuned_run = finished_run(spec)
    searched = load(run.searched_hf, remote=True)
    ids = held_out_ids(spec)
    start = load(tuned_run.distilled_hf, remote=True)
    assert blocks_of(tuned_run.distilled_hf) == blocks_of(run.searched_hf) == blocks_of(tuned_run.finetuned_hf)
    assert len(json.loads((tuned_run.distilled_hf / "config.json").read_text())["block_configs"]) == len(
        blocks_of(run.searched_hf)
    )  # the search's no-op layers are gone: they computed nothing
    with torch.no_grad():  # kept layers distil to the searched network itself (a zero loss moves nothing)
        torch.testing.assert_close(start(ids).logits, searched(ids).logits, atol=1e-5, rtol=1e-5)
    network = build_network(spec, tuned_run).model
    network.load_state_dict(torch.load(tuned_run.finetuned_model, map_location="cpu", weights_only=True))
    tuned = load(tuned_run.finetuned_hf, remote=True)
    assert_runs_as(tuned, network, ids)
    with torch.no_grad():  # it did train
        assert not torch.allclose(tuned(ids).logits, searched(ids).logits, atol=1e-3)


BLOCKED = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pipebd_core", "app", "worker", "tests"):
            raise ModuleNotFoundError(f"{name} is blocked: the directory must load without PipeBD")
sys.meta_path.insert(0, Blocked())
"""


def test_the_directories_load_and_generate_where_pipebd_cannot_be_imported(
    search: tuple[Spec, RunDir], shared_text: Path, finished_run: Callable[[Spec], RunDir], tmp_path: Path
) -> None:
    """Stands in for "a fresh virtualenv with only torch, transformers and safetensors": making one here would
    download gigabytes. `python -I` (no PYTHONPATH, no user site), a meta path finder that refuses pipebd_core,
    app, worker and tests, and a working directory outside the repository."""
    spec, run = search
    plain = finished_run(compression(shared_text, TINY_LLAMA, "ffn_1/2"))
    prompt = held_out_ids(spec)[:1, :4]
    script = BLOCKED + textwrap.dedent(f"""
        import json, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokens = {{}}
        for folder, remote in (({str(run.searched_hf)!r}, True), ({str(plain.distilled_hf)!r}, False)):
            model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=remote, local_files_only=True)
            prompt = torch.tensor({prompt.tolist()!r})
            tokens[folder] = model.generate(prompt, max_new_tokens={NEW_TOKENS}, do_sample=False).tolist()
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote, local_files_only=True)
            assert tokenizer("ab")["input_ids"] == [97, 98]
        try:
            import pipebd_core  # noqa: F401
        except ModuleNotFoundError:
            print(json.dumps(tokens))
    """)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    tokens = json.loads(result.stdout.strip().splitlines()[-1])
    architecture = Architecture.from_json(run.read_json(run.architecture))
    expected = greedy_loop(job_network(spec, run, architecture), prompt, NEW_TOKENS)
    assert tokens[str(run.searched_hf)] == expected.tolist()
    plain_spec = compression(shared_text, TINY_LLAMA, "ffn_1/2")
    assert tokens[str(plain.distilled_hf)] == greedy_loop(job_network(plain_spec, plain, None), prompt, 6).tolist()
