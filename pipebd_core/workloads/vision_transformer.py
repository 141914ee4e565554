"""A torchvision vision transformer as a transformer workload's teacher, cut into its encoder layers.

The teacher is a torchvision builder (`workload.teacher: vit_b_16` and the others of VIT_TEACHERS) at
`data.image_size` with `data.num_classes` classes, its weights from a local torchvision state_dict
(`workload.teacher_weights`; position embeddings interpolated where the state_dict's image size differs),
or a random `VisionTransformer` of `workload.config` (`model_type: vision_transformer`), seeded and warned
about as random CNN teachers are, or a transformers ViT directory's weights copied into torchvision's module
(`workload.teacher` a path, vit_teacher.py). Blocks are the encoder layers (`EncoderBlock`: hidden states of shape
(batch, patches + 1, hidden) in and out, bidirectional, nothing else to relay): the patch embedding, the
class token and the position embeddings prepare block 0's input; the encoder's final LayerNorm and the
classification head read the class token after the last block.

Also here: the attention a `kv_N` or `linear_attention` replacement puts in an encoder layer in place of
its `nn.MultiheadAttention` (which has neither grouped KV heads nor another attention function).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipebd_core.spec import VIT_FAMILY, VIT_TEACHERS, Spec, SpecError
from pipebd_core.workloads.linear_attention import HedgehogFeatureMap, hedgehog_attention
from pipebd_core.workloads.loading import linear_from, read_state_dict
from pipebd_core.workloads.transformer_parts import ModelParts
from pipebd_core.workloads.workload import block_seed

CONFIG_FIELDS = ("patch_size", "num_layers", "num_heads", "hidden_dim", "mlp_dim", "representation_size")
REQUIRED_FIELDS = CONFIG_FIELDS[:-1]
_FIELD = "workload.teacher_weights"


class PatchEmbedding(nn.Module):
    """Images to block 0's hidden states: the patches projected, the class token first, positions added."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.conv_proj, self.class_token = model.conv_proj, model.class_token
        self.pos_embedding = model.encoder.pos_embedding

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = self.conv_proj(images).flatten(2).transpose(1, 2)
        tokens = torch.cat((self.class_token.expand(images.shape[0], -1, -1), patches), dim=1)
        return tokens + self.pos_embedding


class ClassTokenHead(nn.Module):
    """After the last block: the encoder's final LayerNorm of the class token, then the classification head."""

    def __init__(self, norm: nn.Module, heads: nn.Module) -> None:
        super().__init__()
        self.norm, self.heads = norm, heads

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.heads(self.norm(hidden[:, 0]))


class VisionAttention(nn.Module):
    """Bidirectional attention with `kv_heads` key/value heads shared by groups of query heads (softmax), or
    with Hedgehog feature maps (linear attention), called as an encoder layer calls nn.MultiheadAttention:
    `attention(x, x, x, need_weights=False)` gives `(output, None)`."""

    def __init__(self, attention: nn.MultiheadAttention, kv_heads: int, linear: bool) -> None:
        super().__init__()
        hidden, heads = attention.embed_dim, attention.num_heads
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        weights = attention.in_proj_weight.detach().split(hidden)
        biases = (None,) * 3 if attention.in_proj_bias is None else attention.in_proj_bias.detach().split(hidden)
        self.q_proj = linear_from(weights[0], biases[0])
        self.k_proj = linear_from(*_pooled(weights[1], biases[1], heads, kv_heads))
        self.v_proj = linear_from(*_pooled(weights[2], biases[2], heads, kv_heads))
        self.out_proj = linear_from(attention.out_proj.weight.detach(), attention.out_proj.bias)
        if linear:
            self.query_map = HedgehogFeatureMap(heads, self.head_dim)
            self.key_map = HedgehogFeatureMap(heads, self.head_dim)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], count, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: Any = None, value: Any = None, **_: Any) -> tuple[torch.Tensor, None]:
        q = self._heads(self.q_proj(query), self.heads)
        k, v = self._heads(self.k_proj(query), self.kv_heads), self._heads(self.v_proj(query), self.kv_heads)
        if hasattr(self, "query_map"):
            output = hedgehog_attention(self, q, k, v, causal=False)[0]
        else:
            groups = self.heads // self.kv_heads
            output = F.scaled_dot_product_attention(
                q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            )
        return self.out_proj(output.transpose(1, 2).flatten(2)), None


def _pooled(
    weight: torch.Tensor, bias: torch.Tensor | None, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A key or value projection of `heads` heads merged into `kv_heads`: each the mean of its group."""
    if heads % kv_heads:
        raise SpecError(
            f"workload.replacements: kv_{kv_heads}: the teacher's {heads} attention heads do not merge into"
            f" {kv_heads}; use a divisor of {heads}"
        )
    group, head_dim = heads // kv_heads, weight.shape[0] // heads
    pooled = weight.view(kv_heads, group, head_dim, -1).mean(1).reshape(kv_heads * head_dim, -1)
    if bias is None:
        return pooled, None
    return pooled, bias.view(kv_heads, group, head_dim).mean(1).reshape(-1)


def grouped_attention(attention: nn.MultiheadAttention, kv_heads: int) -> VisionAttention:
    """`kv_N` of an encoder layer: its attention with `kv_heads` KV heads, each the mean of those it merges."""
    return VisionAttention(attention, kv_heads, linear=False)


def linear_attention(attention: nn.MultiheadAttention) -> VisionAttention:
    """`linear_attention` of an encoder layer: its projections, Hedgehog maps starting as the identity."""
    return VisionAttention(attention, attention.num_heads, linear=True)


def vit_config(fields: dict[str, Any], spec: Spec) -> dict[str, Any]:
    """workload.config of a vision transformer as VisionTransformer's arguments: a field it has not, or a
    missing one, is refused; the image size and the classes are the data's."""
    options = {key: value for key, value in fields.items() if key != "model_type"}
    unknown = sorted(set(options) - set(CONFIG_FIELDS) - {"image_size"})
    missing = [name for name in REQUIRED_FIELDS if name not in options]
    if unknown or missing:
        problem = f"unknown {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise SpecError(
            f"workload.config: {problem}; a {VIT_FAMILY} config has "
            + ", ".join(REQUIRED_FIELDS)
            + " (and optionally representation_size); the image size is data.image_size"
        )
    image_size = options.pop("image_size", spec.data.image_size)
    if image_size != spec.data.image_size:
        raise SpecError(
            f"workload.config.image_size: {image_size} differs from data.image_size ({spec.data.image_size}),"
            " the size images are resized to; remove it or make them equal"
        )
    return {**options, "image_size": image_size, "num_classes": spec.data.num_classes}


def check_patches(image_size: int, patch_size: int) -> None:
    if image_size % patch_size:
        raise SpecError(
            f"data.image_size: {image_size} is not a multiple of the teacher's patch size ({patch_size});"
            f" use {max(patch_size, image_size // patch_size * patch_size)} or another multiple of {patch_size}"
        )


def build_vit(spec: Spec) -> Any:
    """The torchvision VisionTransformer of `workload.teacher` or `workload.config`, at data.image_size with
    data.num_classes classes, initialised as torchvision does from a seed (train.seed's teacher seed)."""
    from torchvision.models import vision_transformer as tv

    w, data = spec.workload, spec.data
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(block_seed(spec.train.seed, "teacher", 0))
        if w.config is not None:
            options = vit_config(w.config, spec)
            check_patches(data.image_size, options["patch_size"])
            return tv.VisionTransformer(**options)
        check_patches(data.image_size, int(w.teacher.rsplit("_", 1)[1]))
        return getattr(tv, w.teacher)(image_size=data.image_size, num_classes=data.num_classes)


def load_vit(spec: Spec) -> tuple[nn.Module, list[str]]:
    """The vision transformer teacher, in float32 on CPU, eval mode, and its warnings."""
    w = spec.workload
    if w.teacher and w.teacher not in VIT_TEACHERS:  # a transformers ViT directory (vit_teacher.py)
        from pipebd_core.workloads.vit_teacher import load_vit_directory

        return load_vit_directory(spec)
    model = build_vit(spec)
    if w.teacher_weights is not None:
        return model.eval(), _load_weights(model, w.teacher_weights, spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(block_seed(spec.train.seed, "head", 0))
        _draw_head(model)
    name = w.teacher or f"{VIT_FAMILY} of workload.config"
    warning = (
        f"the {name} teacher is randomly initialised (seeded), so the students mimic random features and"
        f" top-1 is meaningless; set {_FIELD} to a torchvision-format state_dict for a real teacher"
    )
    return model.eval(), [warning]


def _draw_head(model: Any) -> None:
    """A random teacher's classification head drawn like its layers (torchvision starts it at zero, which
    would make every logit 0 and a KD target or a logits KL meaningless)."""
    head = model.heads.head
    nn.init.trunc_normal_(head.weight, std=1 / math.sqrt(head.in_features))


def _load_weights(model: Any, path: str, spec: Spec) -> list[str]:
    """Load a torchvision state_dict file into `model`; the warnings."""
    return load_state(model, read_state_dict(path, _FIELD), spec, f"{_FIELD}: {path}")


def load_state(model: Any, state: dict[str, torch.Tensor], spec: Spec, source: str) -> list[str]:
    """Load a torchvision VisionTransformer state_dict (named `source` in errors) into `model`, its positions
    interpolated to the model's image size and its head replaced by one of the state's classes; the warnings."""
    from torchvision.models.vision_transformer import interpolate_embeddings

    positions = state.get("encoder.pos_embedding")
    if positions is not None and positions.shape[1] != model.seq_length:
        state = dict(interpolate_embeddings(model.image_size, model.patch_size, state))
    head = state.get("heads.head.weight")
    warnings = []
    if head is not None and head.shape[0] != spec.data.num_classes:
        model.heads.head = nn.Linear(model.heads.head.in_features, head.shape[0])
        warnings.append(
            f"{source} has a {head.shape[0]}-class head but data.num_classes is {spec.data.num_classes}; top-1"
            " compares the head's class indices with the data's labels as they are"
        )
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # a shape that does not fit
        raise SpecError(f"{source} does not fit the teacher: {error}") from None
    if result.missing_keys or result.unexpected_keys:
        wrong = result.missing_keys[:3] or result.unexpected_keys[:3]
        raise SpecError(
            f"{source} does not fit the teacher ({'missing' if result.missing_keys else 'unexpected'}"
            f" keys such as {', '.join(wrong)}); expected a torchvision VisionTransformer state_dict of"
            f" {spec.workload.teacher or VIT_FAMILY}"
        )
    return warnings


def split_vit(model: Any) -> ModelParts:
    """The patch embedding, encoder layers and class-token head of a torchvision VisionTransformer."""
    head = ClassTokenHead(model.encoder.ln, model.heads)
    return ModelParts(PatchEmbedding(model), list(model.encoder.layers), head, model.hidden_dim, wrap=lambda x: x)


def export_program(network: nn.Module, image_size: int, path: Path) -> None:
    """distilled_model.pt2: `torch.export.load(path).module()(images)` gives the class logits of a batch of
    any size of (3, image_size, image_size) images, without PipeBD."""
    example = torch.zeros(2, 3, image_size, image_size)  # a batch of 1 would be frozen in
    dynamic = ({0: torch.export.Dim("batch", min=1)},)
    program = torch.export.export(network.cpu().eval(), (example,), dynamic_shapes=dynamic)
    torch.export.save(program, path)
