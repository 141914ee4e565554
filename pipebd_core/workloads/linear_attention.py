"""Linear attention with a learned feature map (LoLCATs' Hedgehog attention), as a layer replacement.

Softmax attention weighs value j for query i by exp(q_i . k_j); linear attention by phi(q_i) . phi(k_j),
normalised over j <= i, so a decoder can keep a fixed-size state instead of a growing KV cache. The
feature map is Hedgehog's: phi(x) = [softmax(x W), softmax(-x W)] per head, with W (head_dim x head_dim)
learned and starting as the identity, which LoLCATs trains to mimic the teacher's softmax attention.

The replacement keeps the teacher layer's projections (q, k, v, o, rotary embeddings) and swaps only
the attention function: Hugging Face layers call `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`,
so the copied attention gets its own config naming `pipebd_linear`, registered here on import, and
carries its two feature maps. Training runs in the quadratic (masked) form, which is exact and what
blockwise distillation needs; a recurrent form for generation is not built.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface

IMPLEMENTATION = "pipebd_linear"


class HedgehogFeatureMap(nn.Module):
    """phi(x) = [softmax(x W_h), softmax(-x W_h)] for each head h; W_h starts as the identity."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(head_dim).repeat(heads, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, heads, tokens, head_dim)
        projected = torch.einsum("bhtd,hde->bhte", x, self.weight)
        return torch.cat((projected.softmax(-1), (-projected).softmax(-1)), dim=-1)


def linear_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal linear attention of (batch, heads, tokens, head_dim) tensors: KV heads repeated to the
    query heads, scores phi(q) phi(k)^T masked to j <= i and normalised per query. Returns the output
    as (batch, tokens, heads, head_dim), as Hugging Face's attention functions do, and the weights."""
    mask = attention_mask if attention_mask is not None and attention_mask.dtype == torch.bool else None
    output, weights = hedgehog_attention(module, query, key, value, causal=True, mask=mask)
    return output.transpose(1, 2).contiguous(), weights


def hedgehog_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention of (batch, heads, tokens, head_dim) tensors with `module`'s query_map and key_map: KV
    heads repeated to the query heads, scores phi(q) phi(k)^T (masked to j <= i where `causal`, and to
    `mask`), normalised per query. Returns the output (batch, heads, tokens, head_dim) and the weights."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    query_map, key_map = module.get_submodule("query_map"), module.get_submodule("key_map")
    scores = query_map(query) @ key_map(key).transpose(-1, -2)
    if causal:
        lower = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~lower, 0.0)
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = scores / scores.sum(-1, keepdim=True).clamp_min(1e-6)
    return weights @ value, weights


AttentionInterface.register(IMPLEMENTATION, linear_attention_forward)


def linearise(attention: Any) -> nn.Module:
    """A copy of a Hugging Face attention module computing linear attention, with its projections and
    a Hedgehog feature map for queries and one for keys (one map per query head)."""
    attention = copy.deepcopy(attention)
    config = attention.config
    heads = config.num_attention_heads
    head_dim = getattr(attention, "head_dim", config.hidden_size // heads)
    attention.query_map = HedgehogFeatureMap(heads, head_dim)
    attention.key_map = HedgehogFeatureMap(heads, head_dim)
    attention.config = copy.copy(config)
    attention.config._attn_implementation = IMPLEMENTATION
    return attention
