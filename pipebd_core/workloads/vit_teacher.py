"""A transformers `ViTForImageClassification` directory as a vision transformer job's teacher.

`workload.teacher` is the directory (config.json with `model_type: vit`, safetensors weights), or
`{model: N}` naming a registered one (a job's `distilled_hf/` or `finetuned_hf/`, vit_directory.py). It is
read with `from_pretrained(local_files_only=True)`, no remote code, and its weights are copied into the
torchvision VisionTransformer the workload already cuts into blocks (vision_transformer.py), so a ViT
directory and a torchvision teacher share one code path: the copy is vit_directory.copy_layer run backwards
(q, k and v joined into in_proj; no q/k/v bias, `qkv_bias: false`, is a zero bias), and the LayerNorms keep
the directory's `layer_norm_eps`. The blocks' output is the directory's own logits.

Only what that mapping expresses is read: a classifier (`architectures` naming ViTForImageClassification),
`hidden_act: gelu`, 3 channels, heads dividing the hidden size. Dropout is not carried over (a teacher runs
in eval mode). A directory of another image size than `data.image_size` has its positions interpolated, and
one of another class count keeps its head, as a torchvision state_dict does.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipebd_core.spec import VIT_MODEL_TYPE, Spec, SpecError
from pipebd_core.workloads.vision_transformer import check_patches, load_state

_FIELD = "workload.teacher"
ARCHITECTURE = "ViTForImageClassification"
ACTIVATION = "gelu"  # transformers' exact GELU, torchvision's nn.GELU()


def read_vit_config(folder: Path) -> dict[str, Any]:
    """config.json of a ViT directory, refused (naming the field) where the torchvision mapping cannot take it."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise SpecError(f"{_FIELD}: {folder}/config.json cannot be read: {error}") from None
    problem = config_problem(config)
    if problem is not None:
        raise SpecError(f"{_FIELD}: {folder} is a transformers ViT directory, but {problem}")
    if not any(folder.glob("*.safetensors")):
        raise SpecError(f"{_FIELD}: {folder} has no *.safetensors weights (save them with safe_serialization)")
    return config


def config_problem(config: dict[str, Any]) -> str | None:
    """Why a `model_type: vit` config cannot be a teacher here, naming the field and what works; None if it can."""
    if config.get("model_type") != VIT_MODEL_TYPE:
        return f"its model_type is {config.get('model_type')!r}; use {VIT_MODEL_TYPE!r}"
    if "auto_map" in config:
        return "config.json has auto_map (its own code, never run here); use a plain ViTForImageClassification"
    if ARCHITECTURE not in (config.get("architectures") or []):
        return (
            f"architectures is {config.get('architectures')!r}: a teacher is an image classifier; use a"
            f" {ARCHITECTURE} directory (its classification head is the teacher's last block)"
        )
    if config.get("hidden_act", ACTIVATION) != ACTIVATION:
        return f"hidden_act {config['hidden_act']!r} is not supported; the encoder layers use {ACTIVATION!r}"
    if config.get("num_channels", 3) != 3:
        return f"num_channels is {config['num_channels']}; the teacher reads RGB images, num_channels 3"
    hidden, heads = config.get("hidden_size", 768), config.get("num_attention_heads", 12)
    if hidden % heads:
        return f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}; use a divisor of {hidden}"
    return None


def torchvision_state(model: Any) -> dict[str, torch.Tensor]:
    """A ViTForImageClassification's weights as a torchvision VisionTransformer state_dict."""
    embeddings, state = model.vit.embeddings, {}
    state["class_token"] = embeddings.cls_token
    state["encoder.pos_embedding"] = embeddings.position_embeddings
    _put(state, "conv_proj", embeddings.patch_embeddings.projection)
    for index, layer in enumerate(model.vit.layers):
        prefix, attention = f"encoder.layers.encoder_layer_{index}.", layer.attention
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        state[prefix + "self_attention.in_proj_weight"] = torch.cat([p.weight for p in projections])
        state[prefix + "self_attention.in_proj_bias"] = torch.cat(
            [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in projections]
        )
        _put(state, prefix + "self_attention.out_proj", attention.o_proj)
        _put(state, prefix + "ln_1", layer.layernorm_before)
        _put(state, prefix + "ln_2", layer.layernorm_after)
        _put(state, prefix + "mlp.0", layer.mlp.fc1)
        _put(state, prefix + "mlp.3", layer.mlp.fc2)
    _put(state, "encoder.ln", model.vit.layernorm)
    _put(state, "heads.head", model.classifier)
    return {name: tensor.detach().float() for name, tensor in state.items()}


def _put(state: dict[str, torch.Tensor], prefix: str, module: nn.Module) -> None:
    for name, tensor in module.state_dict().items():
        state[f"{prefix}.{name}"] = tensor


def torchvision_vit(config: dict[str, Any], spec: Spec) -> Any:
    """The torchvision VisionTransformer of a ViT config's shape, at data.image_size with the config's classes."""
    from torchvision.models.vision_transformer import VisionTransformer

    defaults: Any = _vit_defaults()
    patch = config.get("patch_size", defaults.patch_size)
    check_patches(spec.data.image_size, patch)
    eps = config.get("layer_norm_eps", defaults.layer_norm_eps)
    return VisionTransformer(
        image_size=spec.data.image_size,
        patch_size=patch,
        num_layers=config.get("num_hidden_layers", defaults.num_hidden_layers),
        num_heads=config.get("num_attention_heads", defaults.num_attention_heads),
        hidden_dim=config.get("hidden_size", defaults.hidden_size),
        mlp_dim=config.get("intermediate_size", defaults.intermediate_size),
        num_classes=spec.data.num_classes,
        norm_layer=partial(nn.LayerNorm, eps=eps),
    )


def _vit_defaults() -> Any:
    from transformers import ViTConfig

    return ViTConfig()


def load_vit_directory(spec: Spec) -> tuple[nn.Module, list[str]]:
    """The teacher of `workload.teacher` (a ViT directory) as torchvision's VisionTransformer, in float32 on CPU,
    eval mode, and its warnings."""
    from transformers import ViTForImageClassification

    folder = Path(spec.workload.teacher).expanduser()
    config = read_vit_config(folder)
    loader: Any = ViTForImageClassification.from_pretrained
    try:
        model, info = loader(
            str(folder),
            dtype=torch.float32,
            output_loading_info=True,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise SpecError(f"{_FIELD}: {folder} cannot be loaded as a {ARCHITECTURE}: {error}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # transformers would start them at random
        raise SpecError(
            f"{_FIELD}: {folder}'s weights lack {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}; a"
            f" teacher is a complete {ARCHITECTURE} (save it with save_pretrained)"
        )
    vit = torchvision_vit(config, spec)
    warnings = load_state(vit, torchvision_state(model), spec, f"{_FIELD}: {folder}")
    return vit.eval(), warnings
