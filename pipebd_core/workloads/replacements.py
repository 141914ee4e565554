"""The library of replacements for one decoder layer, each built from the teacher layer's own weights.

| name | the student | starts from |
|---|---|---|
| `keep` | the teacher layer itself | a copy: it reproduces the teacher exactly |
| `ffn_P/Q` | the layer with an FFN of P/Q of its width | the FFN channels of largest weight norm, kept in order |
| `kv_N` | the layer with N key/value heads (grouped-query attention) | each new head the mean of the heads it merges |
| `linear_attention` | the layer with linear attention (LoLCATs' Hedgehog map) | its projections; W = I |
| `no_attention` | the layer's FFN alone, with its residual | the teacher's FFN and its norm |
| `linear` | one linear map of the hidden state | the identity |
| `noop` | nothing: the hidden state passes through | (no weights) |

Nothing draws random numbers, so every rank builds the same students. Llama, Qwen2 and Mistral layers
have a gated FFN (`gate_proj`, `up_proj`, `down_proj`) and separate `k_proj`/`v_proj`; GPT-2's FFN is
`c_fc`/`c_proj` (transposed `Conv1D` weights) and its attention has no grouped KV heads. A torchvision
vision transformer's encoder layer has an `MLP` (Linear, GELU, Dropout, Linear, Dropout) and an
`nn.MultiheadAttention`, which `kv_N` and `linear_attention` replace with vision_transformer.py's attention.

A teacher of PipeBD's own layers (pipebd_teacher.py: a searched network) may have layers that are already
replacements (FFN-only, linear; its no-op layers are no blocks): `linear` and `noop` replace them, `ffn_P/Q`
narrows an FFN-only layer's FFN, and a replacement of what such a layer does not have (`kv_N`,
`linear_attention` and `no_attention` of its attention, `ffn_P/Q` of a linear layer's FFN) leaves it as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pipebd_core.spec import SpecError
from pipebd_core.workloads.linear_attention import linearise
from pipebd_core.workloads.loading import linear_from
from pipebd_core.workloads.vision_transformer import grouped_attention, linear_attention

GATED_FFN = ("gate_proj", "up_proj", "down_proj")


class FFNOnly(nn.Module):
    """A decoder layer without its attention: x + FFN(norm(x))."""

    def __init__(self, norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm, self.mlp = norm, mlp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.mlp(self.norm(hidden))


def linear_map(hidden_size: int) -> nn.Linear:
    """A learned linear map of the hidden state, starting as the identity."""
    return linear_from(torch.eye(hidden_size), torch.zeros(hidden_size))


def ffn_channels(mlp: Any, fraction: float) -> torch.Tensor:
    """The intermediate channels a narrowed FFN keeps: the largest products of their input and output
    weight norms, `round(fraction x width)` of them (at least one), in ascending order."""
    if all(hasattr(mlp, name) for name in GATED_FFN):
        scores = mlp.gate_proj.weight.norm(dim=1) * mlp.up_proj.weight.norm(dim=1) * mlp.down_proj.weight.norm(dim=0)
    elif isinstance(mlp, nn.Sequential):  # torchvision's MLP: Linear, GELU, Dropout, Linear, Dropout
        up: Any = mlp[0]
        down: Any = mlp[3]
        scores = up.weight.norm(dim=1) * down.weight.norm(dim=0)
    else:  # GPT-2: Conv1D weights are (in, out)
        scores = mlp.c_fc.weight.norm(dim=0) * mlp.c_proj.weight.norm(dim=1)
    keep = max(1, round(fraction * scores.numel()))
    return torch.topk(scores, keep).indices.sort().values


def _rows(layer: Any, index: torch.Tensor, dim: int) -> None:
    """Keep only `index` along `dim` of the layer's weight (and of its bias along the output)."""
    with torch.no_grad():
        layer.weight = nn.Parameter(layer.weight.index_select(dim, index).clone())
        output_dim = 0 if isinstance(layer, nn.Linear) else 1
        if dim == output_dim and getattr(layer, "bias", None) is not None:
            layer.bias = nn.Parameter(layer.bias.index_select(0, index).clone())


def narrow_ffn(mlp: Any, fraction: float) -> nn.Module:
    """A copy of `mlp` keeping `ffn_channels(mlp, fraction)` of its intermediate channels."""
    index = ffn_channels(mlp, fraction)
    mlp = copy.deepcopy(mlp)
    if all(hasattr(mlp, name) for name in GATED_FFN):
        _rows(mlp.gate_proj, index, 0)
        _rows(mlp.up_proj, index, 0)
        _rows(mlp.down_proj, index, 1)
        mlp.gate_proj.out_features = mlp.up_proj.out_features = mlp.down_proj.in_features = len(index)
        mlp.intermediate_size = len(index)
    elif isinstance(mlp, nn.Sequential):
        up: Any = mlp[0]
        down: Any = mlp[3]
        _rows(up, index, 0)
        _rows(down, index, 1)
        up.out_features = down.in_features = len(index)
    else:
        _rows(mlp.c_fc, index, 1)
        _rows(mlp.c_proj, index, 0)
        mlp.c_fc.nf = mlp.c_proj.nx = len(index)
    return mlp


def pool_kv_heads(attention: Any, heads: int) -> nn.Module:
    """A copy of a grouped-query attention with `heads` KV heads, each the mean of the heads it merges
    (query head h used KV head h // (Q / K) before, and h // (Q / heads) after: the merged groups)."""
    config = attention.config
    before = config.num_key_value_heads
    if before % heads:
        raise SpecError(
            f"workload.replacements: kv_{heads}: the teacher's {before} KV heads do not merge into {heads};"
            f" use a divisor of {before}"
        )
    attention = copy.deepcopy(attention)
    head_dim, group = attention.head_dim, before // heads
    with torch.no_grad():
        for projection in (attention.k_proj, attention.v_proj):
            weight = projection.weight.view(heads, group, head_dim, -1).mean(1).reshape(heads * head_dim, -1)
            projection.weight = nn.Parameter(weight.clone())
            if projection.bias is not None:
                bias = projection.bias.view(heads, group, head_dim).mean(1).reshape(-1)
                projection.bias = nn.Parameter(bias.clone())
            projection.out_features = heads * head_dim
    attention.num_key_value_groups = config.num_attention_heads // heads
    attention.config = copy.copy(config)
    attention.config.num_key_value_heads = heads
    return attention


def _parts(layer: nn.Module) -> tuple[str, str, str]:
    """(attention, FFN, FFN norm) attribute names of a decoder layer."""
    if hasattr(layer, "self_attn"):
        return "self_attn", "mlp", "post_attention_layernorm"
    if hasattr(layer, "self_attention"):  # torchvision's EncoderBlock
        return "self_attention", "mlp", "ln_2"
    return "attn", "mlp", "ln_2"


def swapped_attention(name: str, attention: Any) -> nn.Module:
    """The attention of a `kv_N` or `linear_attention` candidate, built from the teacher layer's."""
    if isinstance(attention, nn.MultiheadAttention):  # a torchvision encoder layer's
        if name == "linear_attention":
            return linear_attention(attention)
        return grouped_attention(attention, int(name.removeprefix("kv_")))
    if name == "linear_attention":
        return linearise(attention)
    if not hasattr(attention, "k_proj"):
        raise SpecError(
            f"workload.replacements: {name}: this teacher's attention has no separate KV heads (GPT-2);"
            " use keep, ffn_P/Q, linear_attention, no_attention, linear or noop"
        )
    return pool_kv_heads(attention, int(name.removeprefix("kv_")))


def build_replacement(
    name: str, layer: nn.Module, hidden_size: int, wrap: Callable[[nn.Module], nn.Module]
) -> nn.Module:
    """The candidate `name` for teacher layer `layer` (a decoder's or a vision transformer's encoder's);
    `wrap` turns a layer into a block (a decoder's: positions and rotary embeddings from the sequence)."""
    if isinstance(layer, FFNOnly | nn.Linear | nn.Identity):
        return replace_replaced(name, layer, hidden_size)
    attention, ffn, norm = _parts(layer)
    if name == "keep":
        return wrap(copy.deepcopy(layer))
    if name.startswith("ffn_"):
        top, bottom = name.removeprefix("ffn_").split("/")
        student = copy.deepcopy(layer)
        setattr(student, ffn, narrow_ffn(getattr(layer, ffn), int(top) / int(bottom)))
        return wrap(student)
    if name.startswith("kv_") or name == "linear_attention":
        student = copy.deepcopy(layer)
        setattr(student, attention, swapped_attention(name, getattr(layer, attention)))
        return wrap(student)
    if name == "no_attention":
        return FFNOnly(copy.deepcopy(getattr(layer, norm)), copy.deepcopy(getattr(layer, ffn)))
    if name == "linear":
        return linear_map(hidden_size)
    assert name == "noop", f"spec validation lets only known replacements through, got {name!r}"
    return nn.Identity()


def replace_replaced(name: str, layer: nn.Module, hidden_size: int) -> nn.Module:
    """The candidate `name` for a teacher layer that is a replacement already (FFN-only, linear or no-op): `linear`
    and `noop` replace it, `ffn_P/Q` narrows an FFN-only layer's FFN, and a replacement of a part the layer does
    not have (attention, or an FFN) leaves it as it is."""
    if name == "linear":
        return linear_map(hidden_size)
    if name == "noop":
        return nn.Identity()
    if name.startswith("ffn_") and isinstance(layer, FFNOnly):
        top, bottom = name.removeprefix("ffn_").split("/")
        return FFNOnly(copy.deepcopy(layer.norm), narrow_ffn(layer.mlp, int(top) / int(bottom)))
    return copy.deepcopy(layer)
