"""PipeBD's heterogeneous decoder: one causal LM whose decoder layers are built one by one from the
config's `block_configs` (configuration_pipebd.py), written by PipeBD and loaded through `auto_map`.

It computes what PipeBD's distilled network computes (the teacher's Llama-family or GPT-2 layers with
their replacements) and generates with a cache of its own (`PipeBDCache`): a softmax-attention layer
keeps its keys and values (with as many heads as its `num_key_value_heads`), a linear-attention layer its
running state (the sums of phi(k) v^T and of phi(k), of fixed size), and a layer without attention keeps
nothing; with the cache a decoding step computes the new tokens only. Padded batches (an attention_mask
with zeros, left padding as batched generate() makes) give the real tokens what the unpadded sequences
give: padding is masked out of attention and of linear attention's state, and positions count real tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.pytorch_utils import Conv1D

from .configuration_pipebd import BlockConfig, PipeBDConfig, RopeDynamic


class PipeBDCache:
    """Per layer what decoding needs of the tokens seen so far: keys and values, or a linear-attention
    state, or nothing; `seen` counts the tokens (the next token's position)."""

    def __init__(self) -> None:
        self.seen = 0
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.is_croppable = False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' (batch, heads, tokens, head_dim) keys and values; all of them back."""
        if layer in self.keys:
            keys = torch.cat((self.keys[layer], keys), dim=2)
            values = torch.cat((self.values[layer], values), dim=2)
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for store in (self.keys, self.values):
            for layer, tensor in store.items():
                store[layer] = tensor.index_select(0, beam_idx.to(tensor.device))
        for layer, (state, norm) in self.states.items():
            self.states[layer] = (state.index_select(0, beam_idx), norm.index_select(0, beam_idx))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(dtype)


def norm_of(config: PipeBDConfig) -> nn.Module:
    if config.family == "gpt2":
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
    return RMSNorm(config.hidden_size, config.norm_eps)


class GatedMLP(nn.Module):
    """Llama, Qwen2, Mistral: down(act(gate(x)) * up(x))."""

    def __init__(self, config: PipeBDConfig, width: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=config.mlp_bias)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))


class GPT2MLP(nn.Module):
    def __init__(self, config: PipeBDConfig, width: int) -> None:
        super().__init__()
        self.c_fc = Conv1D(width, config.hidden_size)
        self.c_proj = Conv1D(config.hidden_size, width)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(hidden)))


def mlp_of(config: PipeBDConfig, width: int) -> nn.Module:
    return GPT2MLP(config, width) if config.family == "gpt2" else GatedMLP(config, width)


class HedgehogFeatureMap(nn.Module):
    """phi(x) = [softmax(x W_h), softmax(-x W_h)] for each head h (LoLCATs' Hedgehog map)."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(heads, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = torch.einsum("bhtd,hde->bhte", x, self.weight)
        return torch.cat((projected.softmax(-1), (-projected).softmax(-1)), dim=-1)


def dynamic_inv_freq(dynamic: RopeDynamic, positions: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK scaling's inverse frequencies for positions up to `positions.max()`: the base stretched
    once the sequence outgrows the original positions (transformers' _compute_dynamic_ntk_parameters)."""
    original, dim = int(dynamic["original_max_position_embeddings"]), int(dynamic["dim"])
    length = torch.maximum(positions.max() + 1, torch.tensor(original, device=positions.device))
    factor = float(dynamic["factor"])
    base = float(dynamic["rope_theta"]) * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))


def rotary_angles(inv_freq: torch.Tensor, positions: torch.Tensor, dynamic: RopeDynamic | None) -> torch.Tensor:
    """(batch, tokens, head_dim) rotary angles of (batch, tokens) positions."""
    if dynamic is not None:
        inv_freq = dynamic_inv_freq(dynamic, positions)
    frequencies = positions[..., None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
    return torch.cat((frequencies, frequencies), dim=-1)


def attention_allowed(tokens: int, keys: int, padding: torch.Tensor) -> torch.Tensor:
    """(batch, 1, tokens, keys): causal (the last `tokens` of `keys` are the new ones) and not padding; a padding
    query with nothing to attend to attends to everything (its output is never used)."""
    allowed = torch.ones(tokens, keys, dtype=torch.bool, device=padding.device).tril(keys - tokens)
    allowed = allowed[None, None] & padding[:, None, None, -keys:]
    return allowed | ~allowed.any(-1, keepdim=True)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    """Softmax or linear attention over (batch, tokens, hidden) with the family's projections."""

    def __init__(self, config: PipeBDConfig, block: BlockConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.family = layer, config.family
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.kv_heads = int(block.get("num_key_value_heads") or self.heads)
        self.scale = float(block.get("scale", self.head_dim**-0.5))
        self.linear = block.get("attention") == "linear"
        hidden, query_size, kv_size = config.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        if config.family == "gpt2":
            self.c_attn = Conv1D(3 * hidden, hidden)
            self.c_proj = Conv1D(hidden, hidden)
        else:
            self.q_proj = nn.Linear(hidden, query_size, bias=config.qkv_bias)
            self.k_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
            self.v_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
            self.o_proj = nn.Linear(query_size, hidden, bias=config.output_bias)
        if self.linear:
            self.query_map = HedgehogFeatureMap(self.heads, self.head_dim)
            self.key_map = HedgehogFeatureMap(self.heads, self.head_dim)

    def project(
        self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values as (batch, heads, tokens, head_dim), rotated where the family rotates."""
        batch, tokens = hidden.shape[:2]
        if self.family == "gpt2":
            query, key, value = self.c_attn(hidden).split(hidden.shape[-1], dim=2)
        else:
            query, key, value = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        query = query.view(batch, tokens, -1, self.head_dim).transpose(1, 2)
        key = key.view(batch, tokens, -1, self.head_dim).transpose(1, 2)
        value = value.view(batch, tokens, -1, self.head_dim).transpose(1, 2)
        if rotary is not None:
            cos, sin = rotary[0].unsqueeze(1), rotary[1].unsqueeze(1)
            query = (query * cos) + (rotate_half(query) * sin)
            key = (key * cos) + (rotate_half(key) * sin)
        return query, key, value

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        cache: PipeBDCache | None,
        padding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        query, key, value = self.project(hidden, rotary)
        if self.linear:
            output = self.linear_attention(query, key, value, cache, padding)
        else:
            output = self.softmax_attention(query, key, value, cache, padding)
        output = output.transpose(1, 2).reshape(*hidden.shape[:2], -1)
        return self.c_proj(output) if self.family == "gpt2" else self.o_proj(output)

    def softmax_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: PipeBDCache | None,
        padding: torch.Tensor | None,
    ) -> torch.Tensor:
        past = 0
        if cache is not None:
            past = cache.keys[self.layer].shape[2] if self.layer in cache.keys else 0
            key, value = cache.update(self.layer, key, value)
        groups = self.heads // self.kv_heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        tokens = query.shape[2]
        if padding is not None:
            allowed = attention_allowed(tokens, key.shape[2], padding)
            return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=self.scale)
        if past == 0 and tokens > 1:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=self.scale)
        if tokens == 1:
            return F.scaled_dot_product_attention(query, key, value, scale=self.scale)
        allowed = torch.ones(tokens, past + tokens, dtype=torch.bool, device=query.device).tril(past)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=self.scale)

    def linear_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache: PipeBDCache | None,
        padding: torch.Tensor | None,
    ) -> torch.Tensor:
        """Causal linear attention: phi(q_i) . sum_{j<=i} phi(k_j) v_j^T over phi(q_i) . sum_{j<=i} phi(k_j),
        the earlier tokens' sums taken from the cache's state; padding keys have phi(k) = 0."""
        groups = self.heads // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        phi_q, phi_k = self.query_map(query), self.key_map(key)
        if padding is not None:
            phi_k = phi_k * padding[:, None, -key.shape[2] :, None].to(phi_k.dtype)
        scores = phi_q @ phi_k.transpose(-1, -2)
        lower = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~lower, 0.0)
        previous = cache.states.get(self.layer) if cache is not None else None
        if previous is None:  # the quadratic form, exactly as PipeBD trained it
            output = (scores / scores.sum(-1, keepdim=True).clamp_min(1e-6)) @ value
        else:
            state, norm = previous
            numerator = phi_q @ state + scores @ value
            denominator = (phi_q @ norm.unsqueeze(-1)).squeeze(-1) + scores.sum(-1)
            output = numerator / denominator.unsqueeze(-1).clamp_min(1e-6)
        if cache is not None:
            state_now = phi_k.transpose(-1, -2) @ value
            norm_now = phi_k.sum(2)
            if previous is not None:
                state_now, norm_now = previous[0] + state_now, previous[1] + norm_now
            cache.states[self.layer] = (state_now, norm_now)
        return output


class DecoderLayer(nn.Module):
    """A teacher layer with its replacement's attention and FFN width: pre-norm, two residuals."""

    def __init__(self, config: PipeBDConfig, block: BlockConfig, layer: int) -> None:
        super().__init__()
        self.gpt2 = config.family == "gpt2"
        attention, mlp = Attention(config, block, layer), mlp_of(config, int(block["intermediate_size"]))
        if self.gpt2:
            self.ln_1, self.attn, self.ln_2, self.mlp = norm_of(config), attention, norm_of(config), mlp
        else:
            self.input_layernorm, self.self_attn = norm_of(config), attention
            self.post_attention_layernorm, self.mlp = norm_of(config), mlp

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        cache: PipeBDCache | None,
        padding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.gpt2:
            hidden = hidden + self.attn(self.ln_1(hidden), rotary, cache, padding)
            return hidden + self.mlp(self.ln_2(hidden))
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rotary, cache, padding)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class FFNOnlyLayer(nn.Module):
    """A layer without its attention: x + FFN(norm(x)); keeps no cache."""

    def __init__(self, config: PipeBDConfig, block: BlockConfig, layer: int) -> None:
        super().__init__()
        self.norm, self.mlp = norm_of(config), mlp_of(config, int(block["intermediate_size"]))

    def forward(
        self, hidden: torch.Tensor, rotary: Any, cache: PipeBDCache | None, padding: Any = None
    ) -> torch.Tensor:
        return hidden + self.mlp(self.norm(hidden))


class LinearLayer(nn.Module):
    """One linear map of the hidden state; keeps no cache."""

    def __init__(self, config: PipeBDConfig, block: BlockConfig, layer: int) -> None:
        super().__init__()
        self.linear = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, hidden: torch.Tensor, rotary: Any, cache: PipeBDCache | None, padding: Any = None
    ) -> torch.Tensor:
        return self.linear(hidden)


class NoopLayer(nn.Module):
    def __init__(self, config: PipeBDConfig, block: BlockConfig, layer: int) -> None:
        super().__init__()

    def forward(
        self, hidden: torch.Tensor, rotary: Any, cache: PipeBDCache | None, padding: Any = None
    ) -> torch.Tensor:
        return hidden


LAYERS: dict[str, type[nn.Module]] = {
    "decoder": DecoderLayer,
    "ffn_only": FFNOnlyLayer,
    "linear": LinearLayer,
    "noop": NoopLayer,
}


class PipeBDPreTrainedModel(PreTrainedModel):
    config_class = PipeBDConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer", "FFNOnlyLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        """Every weight comes from model.safetensors; a fresh model (from_config) starts as PyTorch's."""


class PipeBDModel(PipeBDPreTrainedModel):
    """Token ids to the last layer's normalised hidden states."""

    def __init__(self, config: PipeBDConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.family == "gpt2":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:  # the teacher's rotary frequencies, as its rotary embedding computed them
            self.register_buffer("rotary_inv_freq", torch.zeros(config.head_dim // 2), persistent=True)
        self.layers = nn.ModuleList(
            [LAYERS[block["kind"]](config, block, index) for index, block in enumerate(config.block_configs)]
        )
        self.norm = norm_of(config)
        self.post_init()

    def rotary(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rotary_angles(self.get_buffer("rotary_inv_freq"), positions, self.config.rope_dynamic)
        scaling = self.config.rope_attention_scaling
        return (angles.cos() * scaling).to(hidden.dtype), (angles.sin() * scaling).to(hidden.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        cache: PipeBDCache | None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`attention_mask`: (batch, past + tokens), 0 at padding; positions then count the real tokens."""
        past, tokens = (cache.seen if cache is not None else 0), input_ids.shape[1]
        padding = None if attention_mask is None or bool(attention_mask.bool().all()) else attention_mask.bool()
        if position_ids is None and padding is not None:
            position_ids = (padding.long().cumsum(-1) - 1).clamp_min(0)[:, -tokens:]
        if position_ids is None:
            position_ids = torch.arange(past, past + tokens, device=input_ids.device).unsqueeze(0)
        hidden = self.embed_tokens(input_ids)
        rotary = None
        if self.config.family == "gpt2":
            hidden = hidden + self.embed_positions(position_ids)
        else:
            rotary = self.rotary(hidden, position_ids.expand(input_ids.shape[0], -1))
        for layer in self.layers:
            hidden = layer(hidden, rotary, cache, padding)
        if cache is not None:
            cache.seen = past + input_ids.shape[1]
        return self.norm(hidden)


class PipeBDForCausalLM(PipeBDPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: PipeBDConfig) -> None:
        super().__init__(config)
        self.model = PipeBDModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own PipeBDCache on the first forward with use_cache

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: PipeBDCache | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ValueError("PipeBDForCausalLM takes input_ids (inputs_embeds are not supported)")
        cache = cache if cache is not None else kwargs.get("past_key_values")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = PipeBDCache()
        hidden = self.model(input_ids, position_ids, cache if use_cache else None, attention_mask)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)  # type: ignore[arg-type]
