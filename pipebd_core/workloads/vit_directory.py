"""A vision transformer job's network as a `transformers` ViTForImageClassification directory, where it is one.

The network (block 0: the patch embedding and the first encoder layer, then one encoder layer per block,
then the final LayerNorm of the class token and the classification head) is a plain torchvision
VisionTransformer when every layer is `keep` or every layer one `ffn_P/Q` (every FFN the same width) and
the head is one linear layer (no `representation_size`). Then `distilled_hf/` (and after the finetune phase
`finetuned_hf/`) holds config.json (`model_type: vit`), model.safetensors and preprocessor_config.json (a
ViTImageProcessor: resized to `data.image_size`, 8-bit values rescaled to [0, 1] and normalised with the
data's mean and spread), loaded by `ViTForImageClassification.from_pretrained(dir)` without remote code,
giving the network's logits.

Any other network (a search's mixed layers, `kv_N` and `linear_attention`, whose attention is PipeBD's
VisionAttention, `no_attention`, `linear`, `noop`) has no transformers form without code of its own, and
PipeBD writes no modeling code for images: it stays `distilled_model.pt2` (a torch.export program that needs
no PipeBD) and `distilled_state.pt`, and no directory is written.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from pipebd_core.documents.architecture import Architecture
from pipebd_core.spec import Spec


def encoder_layers(network: nn.Module) -> tuple[Any, list[nn.Module], Any] | None:
    """(patch embedding, encoder layers, class-token head) of a vision transformer job's network; None where it
    is not laid out so."""
    from pipebd_core.workloads.vision_transformer import ClassTokenHead, PatchEmbedding

    blocks = list(network.children())
    first: Any = blocks[0] if blocks else None
    if not isinstance(first, nn.Sequential) or len(first) != 2 or not isinstance(first[0], PatchEmbedding):
        return None
    if not isinstance(blocks[-1], ClassTokenHead):
        return None
    return first[0], [first[1], *blocks[1:-1]], blocks[-1]


def vit_layer_names(spec: Spec, network: nn.Module, architecture: Architecture | None) -> list[str]:
    """Each layer's replacement: a search's choices, or a compression's one name for every layer."""
    if architecture is not None:
        return [block.layers[0] for block in architecture.blocks]
    parts = encoder_layers(network)
    return [spec.workload.replacements[0]] * (len(parts[1]) if parts is not None else 0)


def expressible(layers: Sequence[nn.Module], names: Sequence[str], head: Any) -> bool:
    """Whether the network is a plain torchvision ViT: torchvision encoder layers of one FFN width, one head."""
    from torchvision.models.vision_transformer import EncoderBlock

    if any(name != names[0] for name in names) or not (names[0] == "keep" or names[0].startswith("ffn_")):
        return False
    plain = all(
        isinstance(layer, EncoderBlock) and isinstance(layer.self_attention, nn.MultiheadAttention) for layer in layers
    )
    if not plain or not isinstance(head.heads, nn.Sequential) or len(head.heads) != 1:
        return False
    return len({layer.mlp[0].out_features for layer in layers if isinstance(layer, EncoderBlock)}) == 1


def vit_config(spec: Spec, embedding: Any, layers: Sequence[Any], head: Any) -> Any:
    from transformers import ViTConfig

    first = layers[0]
    config = ViTConfig(
        hidden_size=embedding.class_token.shape[-1],
        num_hidden_layers=len(layers),
        num_attention_heads=first.self_attention.num_heads,
        intermediate_size=first.mlp[0].out_features,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=first.ln_1.eps,
        image_size=spec.data.image_size,
        patch_size=embedding.conv_proj.kernel_size[0],
        num_channels=embedding.conv_proj.in_channels,
        qkv_bias=True,
    )
    config.num_labels = head.heads[0].out_features
    return config


def copy_layer(target: Any, layer: Any) -> None:
    """A torchvision EncoderBlock's weights into a transformers ViTLayer (q, k, v split from in_proj)."""
    attention = layer.self_attention
    hidden = attention.embed_dim
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        projection = getattr(target.attention, name)
        projection.weight.copy_(attention.in_proj_weight[index * hidden : (index + 1) * hidden])
        projection.bias.copy_(attention.in_proj_bias[index * hidden : (index + 1) * hidden])
    target.attention.o_proj.load_state_dict(attention.out_proj.state_dict())
    target.layernorm_before.load_state_dict(layer.ln_1.state_dict())
    target.layernorm_after.load_state_dict(layer.ln_2.state_dict())
    target.mlp.fc1.load_state_dict(layer.mlp[0].state_dict())
    target.mlp.fc2.load_state_dict(layer.mlp[3].state_dict())


def vit_model(spec: Spec, embedding: Any, layers: Sequence[Any], head: Any) -> Any:
    """ViTForImageClassification holding the network's weights."""
    import torch
    from transformers import ViTForImageClassification

    model: Any = ViTForImageClassification(vit_config(spec, embedding, layers, head)).float().eval()
    with torch.no_grad():
        embeddings = model.vit.embeddings
        embeddings.cls_token.copy_(embedding.class_token)
        embeddings.position_embeddings.copy_(embedding.pos_embedding)
        embeddings.patch_embeddings.projection.load_state_dict(embedding.conv_proj.state_dict())
        for target, layer in zip(model.vit.layers, layers, strict=True):
            copy_layer(target, layer)
        model.vit.layernorm.load_state_dict(head.norm.state_dict())
        model.classifier.load_state_dict(head.heads[0].state_dict())
    return model


def normalisation(spec: Spec) -> tuple[list[float], list[float]] | None:
    """Per channel the mean and spread the data set normalises [0, 1] pixels with; None where it takes its
    values as they are (synthetic, custom)."""
    if spec.data.dataset == "digits":
        from pipebd_core.data.digits import normalisation as digits_normalisation

        mean, std = digits_normalisation(spec.data.image_size)
        return [mean] * 3, [std] * 3
    if spec.data.dataset in ("cifar10", "imagefolder"):
        from pipebd_core.data.images import CIFAR_MEAN, CIFAR_STD, IMAGENET_MEAN, IMAGENET_STD

        cifar = spec.data.dataset == "cifar10"
        return list(CIFAR_MEAN if cifar else IMAGENET_MEAN), list(CIFAR_STD if cifar else IMAGENET_STD)
    return None


def image_processor(spec: Spec) -> Any:
    """What turns an RGB image into the values the network was trained on: resized (bilinear), 8-bit values
    rescaled to [0, 1] and normalised as the data set does; values taken as they are where it has no such steps."""
    from transformers import ViTImageProcessor

    size, found = spec.data.image_size, normalisation(spec)
    if found is None:
        return ViTImageProcessor(
            do_resize=False, do_rescale=False, do_normalize=False, size={"height": size, "width": size}
        )
    mean, std = found
    return ViTImageProcessor(
        do_resize=True, size={"height": size, "width": size}, resample=2, image_mean=mean, image_std=std
    )


def write_vit_directory(spec: Spec, network: nn.Module, names: Sequence[str], folder: Path) -> bool:
    """`network` (a vision transformer job's, layers `names`) as a ViTForImageClassification directory in
    `folder`, replacing what was there, where it is a plain torchvision ViT; False (nothing written) where not."""
    parts = encoder_layers(network)
    if parts is None or not names or not expressible(parts[1], names, parts[2]):
        return False
    embedding, layers, head = parts
    model = vit_model(spec, embedding, layers, head)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    image_processor(spec).save_pretrained(str(folder))
    return True
