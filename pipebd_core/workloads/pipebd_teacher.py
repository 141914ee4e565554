"""A Hugging Face directory of PipeBD's own layers (a searched network, hf_directory.py) as a job's teacher.

So a search's output is the next job's starting point: compressed further (a transformer job whose
`workload.teacher` is the directory, or `{model: N}` naming it), or fine-tuned (the same job with `keep` and a
`finetune` section). The directory is checked first (remote_format.py: PipeBD's auto_map and a version this
PipeBD reads) and loaded WITHOUT trust_remote_code: PipeBD's own copy of the modeling code (hf_remote/) reads
config.json and model.safetensors. Its layers then become the network form every transformer job's
blocks have, one per `block_configs` entry, holding the directory's weights:

    decoder (softmax)   the family's decoder layer (Llama; Qwen2 where only q, k and v have a bias; GPT-2)
                        with the block's KV heads, FFN width and attention scale, in a DecoderBlock
    decoder (linear)    the same with linear attention (linear_attention.py) and the block's feature maps
    ffn_only            FFNOnly: the norm and FFN of a layer without attention
    linear              nn.Linear of the hidden state
    noop                no layer at all: it computes nothing, so it is no block (a block without
                        weights has nothing to train), and the next job's network has one layer fewer

so its blocks distill, replace and write back (hf_directory.py) as a family teacher's replacements do.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipebd_core.spec import SpecError
from pipebd_core.workloads.remote_format import pipebd_config_problem
from pipebd_core.workloads.replacements import FFNOnly
from pipebd_core.workloads.transformer_parts import ModelParts

if TYPE_CHECKING:  # the remote code imports transformers, which these modules import only when they run
    from pipebd_core.workloads.hf_remote.configuration_pipebd import BlockConfig, RopeDynamic

_FIELD = "workload.teacher"


class StoredRotary(nn.Module):
    """The rotary embedding a PipeBD directory stores: its teacher's inverse frequencies and attention scaling
    (every static rope type, linear and llama3 and yarn included, is these two), with dynamic NTK scaling
    where the directory has it (hf_remote/modeling_pipebd.py: dynamic_inv_freq)."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, dynamic: RopeDynamic | None) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self.attention_scaling, self.dynamic = attention_scaling, dynamic

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from pipebd_core.workloads.hf_remote.modeling_pipebd import rotary_angles

        angles = rotary_angles(self.get_buffer("inv_freq"), positions, self.dynamic)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(hidden.dtype), sin.to(hidden.dtype)


def read_pipebd_config(path: Path, config: dict[str, Any]) -> None:
    """Refuse a PipeBD directory this PipeBD cannot read back (its auto_map, version or block list)."""
    problem = pipebd_config_problem(config)
    if problem is not None:
        raise SpecError(f"{_FIELD}: {path} is a network of PipeBD's own layers (model_type pipebd), but {problem}")


def load_pipebd_model(folder: Path) -> Any:
    """The directory's PipeBDForCausalLM, in float32 on CPU, built by PipeBD's own copy of the code."""
    from pipebd_core.workloads.hf_remote.configuration_pipebd import PipeBDConfig
    from pipebd_core.workloads.hf_remote.modeling_pipebd import PipeBDForCausalLM

    read_pipebd_config(folder, json.loads((folder / "config.json").read_text()))
    try:
        config = PipeBDConfig.from_pretrained(str(folder), local_files_only=True)
        model = PipeBDForCausalLM.from_pretrained(
            str(folder), config=config, dtype=torch.float32, use_safetensors=True, local_files_only=True
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise SpecError(f"{_FIELD}: cannot load PipeBD's network in {folder}: {error}") from None
    return model.eval()


def family_config(config: Any, block: BlockConfig) -> Any:
    """The Hugging Face config of one layer: the teacher family's, with the block's KV heads and FFN width."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    width = int(block.get("intermediate_size") or 4 * config.hidden_size)
    if config.family == "gpt2":
        layer_config: Any = GPT2Config(
            n_embd=config.hidden_size,
            n_head=config.num_attention_heads,
            n_inner=width,
            n_positions=config.max_position_embeddings,
            vocab_size=config.vocab_size,
            layer_norm_epsilon=config.norm_eps,
            activation_function=config.hidden_act,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
        )
    else:
        qwen2 = config.qkv_bias and not config.output_bias
        family: Any = Qwen2Config if qwen2 else LlamaConfig
        biases = {} if qwen2 else {"attention_bias": config.qkv_bias, "mlp_bias": config.mlp_bias}
        layer_config = family(
            hidden_size=config.hidden_size,
            intermediate_size=width,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=int(block.get("num_key_value_heads") or config.num_attention_heads),
            head_dim=config.head_dim,
            rms_norm_eps=config.norm_eps,
            hidden_act=config.hidden_act,
            vocab_size=config.vocab_size,
            max_position_embeddings=config.max_position_embeddings,
            attention_dropout=0.0,
            **biases,
        )
    layer_config._attn_implementation = "sdpa"
    return layer_config


def decoder_layer(config: Any, block: BlockConfig, index: int) -> nn.Module:
    """An empty family decoder layer shaped as the block describes (its attention linear where it is)."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Config, Qwen2DecoderLayer

    from pipebd_core.workloads.linear_attention import linearise

    layer_config = family_config(config, block)
    layer: Any
    if config.family == "gpt2":
        layer = GPT2Block(layer_config, layer_idx=index)
    elif isinstance(layer_config, Qwen2Config):
        layer = Qwen2DecoderLayer(layer_config, index)
    else:
        layer = LlamaDecoderLayer(layer_config, index)
    attention = "attn" if config.family == "gpt2" else "self_attn"
    getattr(layer, attention).scaling = float(block.get("scale", config.head_dim**-0.5))
    if block.get("attention") == "linear":
        setattr(layer, attention, linearise(getattr(layer, attention)))
    return layer


def ffn_only_layer(config: Any, block: BlockConfig) -> nn.Module:
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    layer_config = family_config(config, block)
    if config.family == "gpt2":
        norm: nn.Module = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        return FFNOnly(norm, GPT2MLP(layer_config.n_inner, layer_config))
    return FFNOnly(LlamaRMSNorm(config.hidden_size, eps=config.norm_eps), LlamaMLP(layer_config))


def teacher_layer(config: Any, block: BlockConfig, index: int, stored: nn.Module) -> nn.Module:
    """Layer `index` as the block describes it (not a no-op), holding the weights of `stored` (the
    directory's layer)."""
    kind = block["kind"]
    layer: nn.Module
    if kind == "decoder":
        layer = decoder_layer(config, block, index)
    elif kind == "ffn_only":
        layer = ffn_only_layer(config, block)
    else:
        layer = nn.Linear(config.hidden_size, config.hidden_size)
        stored = stored.get_submodule("linear")
    layer.load_state_dict(stored.state_dict())
    return layer.float().eval()


def split_pipebd_model(model: Any) -> ModelParts:
    """The embedding, the layers (one per block description), the rotary embedding and the head of a PipeBD
    directory's model, in the form transformer.split_model gives a family's."""
    from pipebd_core.workloads.transformer import DecoderBlock, LMHead, TokenEmbedding

    config, body = model.config, model.model
    layers = [
        teacher_layer(config, block, index, stored)
        for index, (block, stored) in enumerate(zip(config.block_configs, body.layers, strict=True))
        if block["kind"] != "noop"
    ]
    if not layers:
        raise SpecError(f"{_FIELD}: every layer of this network of PipeBD's own layers is a no-op: nothing to distil")
    gpt2 = config.family == "gpt2"
    embedding = TokenEmbedding(body.embed_tokens, body.embed_positions if gpt2 else None)
    head = LMHead(body.norm, model.lm_head)
    rotary = (
        None
        if gpt2
        else StoredRotary(body.get_buffer("rotary_inv_freq"), config.rope_attention_scaling, config.rope_dynamic)
    )

    def wrap(layer: nn.Module) -> nn.Module:
        """A decoder layer as a block (positions and rotary embeddings from the sequence); the layers without
        attention are blocks as they are."""
        if isinstance(layer, FFNOnly | nn.Linear | nn.Identity):
            return layer
        return DecoderBlock(layer, copy.deepcopy(rotary))

    return ModelParts(embedding, layers, head, config.hidden_size, wrap)
