"""PipeBD's remote code (workloads/hf_remote/) against transformers' own LlamaForCausalLM on a tiny config:
left-padded batches give the real tokens the unpadded sequence's logits, batched generate() with padding
gives transformers' tokens, dynamic and linear rope scaling are honoured, and a rope type the remote code
does not compute is refused naming it. Also the version a directory of PipeBD's own layers must carry to be
read back (remote_format.py) is the version the code writes.

Oracles: transformers' Llama (the teacher of `workload.config`, loaded by the transformer workload) and the
same PipeBD model run on the sequences without padding. No job: the networks are built in-process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.hf_directory import network_parts, remote_model, teacher_config
from pipebd_core.workloads.hf_remote.configuration_pipebd import VERSION
from pipebd_core.workloads.remote_format import READABLE_VERSIONS, pipebd_config_problem
from pipebd_core.workloads.transformer import build_transformer_workload, load_teacher, rebuild, split_model
from tests.transformer_specs import TINY_LLAMA, transformer_document, write_text

PAD = 3  # left padding of the second row
ROPES = {
    "default": {},
    "linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "dynamic": {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
}


@pytest.fixture(scope="module")
def text_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("text"))


def spec_of(text_root: Path, fields: dict[str, Any], replacements: list[str]) -> Spec:
    """A tiny Llama of 8 positions (so 12 tokens are beyond them: dynamic rope rescales)."""
    document = transformer_document(text_root)
    config = {**TINY_LLAMA, "max_position_embeddings": 8, **fields}
    document["workload"] = {"kind": "transformer", "config": config, "replacements": replacements}
    return parse_spec(document)


def remote_of(spec: Spec, network: torch.nn.Module, names: list[str]) -> Any:
    """The PipeBDForCausalLM that a job's directory of `network` holds (built in-process, no directory)."""
    if not isinstance(network[0], torch.nn.Sequential):  # the network of a teacher's parts: block 0 embeds
        network = torch.nn.Sequential(torch.nn.Sequential(network[0], network[1]), *network[2:])
    embedding, layers, head = network_parts(network)
    return remote_model(teacher_config(spec), embedding, layers, names, head, tied=False).eval()


def padded(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0 as it is; row 1 shortened by PAD tokens and left-padded back to length (pad id 0, mask 0)."""
    batch = ids.clone()
    batch[1, PAD:] = ids[1, :-PAD]
    batch[1, :PAD] = 0
    mask = torch.ones_like(batch)
    mask[1, :PAD] = 0
    return batch, mask


def llama_positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp_min(0)


def sharp_llama(spec: Spec) -> Any:
    """The spec's Llama with queries and keys scaled up, so attention (and with it the rotary embedding's
    every frequency) moves the logits by far more than the tolerance."""
    llama, _ = load_teacher(spec)
    with torch.no_grad():
        for name, parameter in llama.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(30.0)
    return llama.eval()


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_the_remote_code_gives_llamas_logits_padded_or_not(rope: str, text_root: Path) -> None:
    spec = spec_of(text_root, {"num_attention_heads": 2, "num_key_value_heads": 2, **ROPES[rope]}, ["keep"])
    llama = sharp_llama(spec)
    parts = split_model(llama)
    network = torch.nn.Sequential(parts.embedding, *(parts.block(layer) for layer in parts.layers), parts.head)
    model = remote_of(spec, network, ["keep"] * TINY_LLAMA["num_hidden_layers"])
    assert (model.config.rope_dynamic is not None) == (rope == "dynamic")
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    batch, mask = padded(ids)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, atol=1e-5, rtol=1e-5)
        ours = model(batch, attention_mask=mask).logits
        theirs = llama(batch, attention_mask=mask, position_ids=llama_positions(mask)).logits
        # padding changes nothing: within the original 8 positions (beyond them dynamic rope's frequencies
        # follow the batch's longest sequence, in transformers too)
        short = model(batch[:, :8], attention_mask=mask[:, :8]).logits
        alone = model(ids[1:, : 8 - PAD]).logits
    torch.testing.assert_close(ours[:, PAD:], theirs[:, PAD:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(short[1, PAD:], alone[0], atol=1e-5, rtol=1e-5)
    prompt, prompt_mask = batch[:, :6], mask[:, :6]
    options: dict[str, Any] = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    for use_cache in (True, False):  # dynamic rope: cached keys keep the frequencies they were made with
        generated = model.generate(prompt, attention_mask=prompt_mask, use_cache=use_cache, **options)
        assert torch.equal(
            generated, llama.generate(prompt, attention_mask=prompt_mask, use_cache=use_cache, **options)
        )


def test_padding_is_kept_out_of_every_kind_of_layer(text_root: Path) -> None:
    """Linear attention's state, fewer KV heads, attention-free layers: the real tokens' logits are the
    unpadded sequence's, with and without the cache."""
    names = ["linear_attention", "kv_1", "no_attention", "linear"]
    spec = spec_of(text_root, {}, ["keep", *names])
    blocks = [ArchitectureBlock(block=i, layers=[name], loss=0.0, params=0) for i, name in enumerate(names)]
    network = rebuild(spec, Architecture(blocks=blocks, candidates=[], chosen_by="this test", teacher_params=0))
    with torch.no_grad():  # trained-looking feature maps, away from the identity
        for name, parameter in network.named_parameters():
            if name.endswith(("query_map.weight", "key_map.weight")):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    model = remote_of(spec, network, names)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
    batch, mask = padded(ids)
    with torch.no_grad():
        ours = model(batch, attention_mask=mask).logits
        torch.testing.assert_close(ours[1, PAD:], model(ids[1:, :-PAD]).logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours[0], network(ids[:1])[0], atol=1e-5, rtol=1e-5)
        prefill = model(batch[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        step = model(batch[:, -1:], attention_mask=mask, cache=prefill.cache, use_cache=True)
    torch.testing.assert_close(step.logits[:, -1], ours[:, -1], atol=1e-5, rtol=1e-5)


def test_a_rope_type_the_remote_code_does_not_compute_is_refused_naming_it(text_root: Path) -> None:
    longrope = {
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.0],
            "long_factor": [2.0, 2.0],
            "original_max_position_embeddings": 4,
        }
    }
    with pytest.raises(SpecError, match=r"rope scaling 'longrope' is not one .* \(default, linear, llama3, yarn, "):
        build_transformer_workload(spec_of(text_root, longrope, ["keep", "noop"]))
    build_transformer_workload(spec_of(text_root, longrope, ["ffn_1/2"]))  # the family's directory carries it


def test_the_version_written_is_one_read_back_and_another_is_refused_naming_both() -> None:
    config = {
        "model_type": "pipebd",
        "auto_map": {
            "AutoConfig": "configuration_pipebd.PipeBDConfig",
            "AutoModelForCausalLM": "modeling_pipebd.PipeBDForCausalLM",
        },
        "block_configs": [{"kind": "noop"}],
        "pipebd_version": VERSION,
    }
    assert VERSION in READABLE_VERSIONS and pipebd_config_problem(config) is None
    problem = pipebd_config_problem({**config, "pipebd_version": "7"})
    assert problem is not None and "version '7'" in problem and "reads versions 1, 2" in problem
    foreign = pipebd_config_problem({**config, "auto_map": {"AutoModelForCausalLM": "modeling_x.X"}})
    assert foreign is not None and "not PipeBD's" in foreign
