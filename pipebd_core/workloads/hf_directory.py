"""A distilled, searched or fine-tuned language model as a Hugging Face model directory.

What a transformer job's network (block 0: the token embedding and the first layer's replacement, then one
replacement per layer, then the final norm and LM head) becomes, so that `transformers` takes it:

- Every layer `keep`, or every layer one `ffn_P/Q`, or every layer one `kv_N`: config.json is the teacher's
  `model_type` with `intermediate_size` (GPT-2: `n_inner`) or `num_key_value_heads` changed, and the
  directory loads with `AutoModelForCausalLM.from_pretrained(dir)`, no remote code.
- Anything else (a search's mixed choices, `linear_attention`, `no_attention`, `linear`, `noop`): config.json
  has `model_type` `pipebd`, one block description per layer in `block_configs`, and `auto_map` to the
  directory's own `configuration_pipebd.py` and `modeling_pipebd.py` (hf_remote/, copied verbatim, their
  VERSION in `pipebd_version`); it loads with `from_pretrained(dir, trust_remote_code=True)`. The teacher's
  rope scaling is stored where the remote code computes it (every static type, and `dynamic`); another type
  (longrope) is refused, naming it. Such a directory is also a later job's teacher (pipebd_teacher.py), and
  what that job writes is PipeBD's remote code again.

Beside config.json: model.safetensors; generation_config.json with the data's end-of-document token (256
with the byte-level tokenizer) as `eos_token_id` and `pad_token_id`; and the tokenizer the data was
encoded with: the files of `data.tokenizer`'s folder, or PipeBD's byte-level tokenizer (byte b is token b,
the end of document is 256) written as a tokenizer.json, so `AutoTokenizer.from_pretrained(dir)` gives
exactly the ids the model was trained on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipebd_core.documents.architecture import Architecture
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.remote_format import AUTO_MAP, MODEL_TYPE
from pipebd_core.workloads.replacements import FFNOnly
from pipebd_core.workloads.transformer import DecoderBlock, LMHead, TokenEmbedding

if TYPE_CHECKING:  # the remote code imports transformers, which these modules import only when they run
    from pipebd_core.workloads.hf_remote.configuration_pipebd import BlockConfig, RopeDynamic

REMOTE = Path(__file__).parent / "hf_remote"
REMOTE_FILES = ("configuration_pipebd.py", "modeling_pipebd.py")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inverse frequencies and a scaling fixed at load: stored
EOS_TOKEN = "<|endoftext|>"  # the byte-level tokenizer's name for its end-of-document token
TOKENIZER_FILES = (  # what a data.tokenizer folder may hold that AutoTokenizer reads
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def layer_names(spec: Spec, architecture: Architecture | None) -> list[str]:
    """Each layer's replacement: a search's choices (architecture.json), or a compression's one name."""
    if architecture is not None:
        return [block.layers[0] for block in architecture.blocks]
    replacements = spec.workload.replacements
    assert len(replacements) == 1, "a search's layers are named by its architecture.json"
    config = teacher_config(spec)
    if config.model_type == MODEL_TYPE:  # a teacher of PipeBD's own layers: its no-op layers are no blocks
        return [replacements[0]] * sum(block["kind"] != "noop" for block in config.block_configs)
    return [replacements[0]] * config.num_hidden_layers


def teacher_config(spec: Spec) -> Any:
    """The teacher's Hugging Face config, as the teacher directory or `workload.config` gives it."""
    from transformers import AutoConfig

    w = spec.workload
    if w.config is not None:
        options = {key: value for key, value in w.config.items() if key != "model_type"}
        return AutoConfig.for_model(w.config["model_type"], **options)
    folder = Path(w.teacher).expanduser()
    if json.loads((folder / "config.json").read_text()).get("model_type") == MODEL_TYPE:  # PipeBD's own layers
        from pipebd_core.workloads.hf_remote.configuration_pipebd import PipeBDConfig

        return PipeBDConfig.from_pretrained(str(folder), local_files_only=True)
    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


def write_model_directory(spec: Spec, network: nn.Module, names: Sequence[str], folder: Path) -> None:
    """`network` (a transformer job's, layers `names`) as a Hugging Face model directory in `folder`,
    replacing what was there."""
    embedding, layers, head = network_parts(network)
    assert len(layers) == len(names), f"{len(layers)} layers, {len(names)} names"
    config = teacher_config(spec)
    projection: Any = head.projection
    tied = bool(config.tie_word_embeddings) and torch.equal(embedding.tokens.weight, projection.weight)
    uniform = uniform_fields(config, layers, names)
    model = (
        uniform_model(config, uniform, embedding, layers, head, tied)
        if uniform is not None
        else remote_model(config, embedding, layers, names, head, tied)
    )
    save_model_directory(spec, model, folder, teacher=config)
    if uniform is None:
        for name in REMOTE_FILES:
            shutil.copyfile(REMOTE / name, folder / name)


def save_model_directory(spec: Spec, model: Any, folder: Path, teacher: Any = None) -> None:
    """A `transformers` model as the directory every language model a job makes is (distilled_hf/,
    searched_hf/, finetuned_hf/, teacher_model/), replacing what was in `folder`: config.json and
    generation_config.json with the data's special tokens, model.safetensors, and the data's tokenizer.
    `teacher`: the config whose special tokens stand where the data is not text (default: the model's)."""
    eos, bos = special_tokens(spec, model.config if teacher is None else teacher)
    for holder in (model.config, model.generation_config):
        holder.eos_token_id, holder.pad_token_id, holder.bos_token_id = eos, eos, bos
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    if spec.data.dataset == "text":
        write_tokenizer(spec, folder)


def network_parts(network: nn.Module) -> tuple[TokenEmbedding, list[nn.Module], LMHead]:
    """(embedding, one module per layer, head) of nn.Sequential(Sequential(embedding, layer 0), layer 1, ..., head)."""
    blocks = list(network.children())
    first, head = blocks[0], blocks[-1]
    assert isinstance(first, nn.Sequential) and isinstance(first[0], TokenEmbedding), "block 0 embeds the ids"
    assert isinstance(head, LMHead), "the network ends with the final norm and LM head"
    return first[0], [first[1], *blocks[1:-1]], head


def uniform_fields(config: Any, layers: Sequence[nn.Module], names: Sequence[str]) -> dict[str, Any] | None:
    """The teacher config's fields to change where every layer has one replacement its family expresses
    (keep, ffn_P/Q, kv_N); None where the layers need PipeBD's own modeling code."""
    name = names[0]
    if config.model_type == MODEL_TYPE:  # a teacher of PipeBD's own layers has no family to express it
        return None
    if any(other != name for other in names) or not (name == "keep" or name.startswith(("ffn_", "kv_"))):
        return None
    layer: Any = layers[0]
    assert isinstance(layer, DecoderBlock), f"a {name} layer is a decoder layer"
    if name.startswith("ffn_"):
        return {"n_inner" if config.model_type == "gpt2" else "intermediate_size": ffn_width(layer.layer.mlp)}
    if name.startswith("kv_"):
        return {"num_key_value_heads": int(name.removeprefix("kv_"))}
    return {}


def ffn_width(mlp: Any) -> int:
    return int(mlp.c_fc.nf) if hasattr(mlp, "c_fc") else int(mlp.gate_proj.out_features)


def uniform_model(
    config: Any,
    fields: dict[str, Any],
    embedding: TokenEmbedding,
    layers: Sequence[nn.Module],
    head: LMHead,
    tied: bool,
) -> Any:
    """The teacher's family with `fields` changed, holding the network's weights (every part loaded strictly)."""
    from transformers import AutoModelForCausalLM

    for key, value in fields.items():
        setattr(config, key, value)
    config.tie_word_embeddings = tied
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    body = model.transformer if config.model_type == "gpt2" else model.model
    decoder = body.h if config.model_type == "gpt2" else body.layers
    (body.wte if config.model_type == "gpt2" else body.embed_tokens).load_state_dict(embedding.tokens.state_dict())
    if embedding.positions is not None:
        body.wpe.load_state_dict(embedding.positions.state_dict())
    for target, layer in zip(decoder, layers, strict=True):
        assert isinstance(layer, DecoderBlock)
        target.load_state_dict(layer.layer.state_dict())
    (body.ln_f if config.model_type == "gpt2" else body.norm).load_state_dict(head.norm.state_dict())
    if not tied:
        model.lm_head.load_state_dict(head.projection.state_dict())
    return model


def remote_model(
    config: Any,
    embedding: TokenEmbedding,
    layers: Sequence[nn.Module],
    names: Sequence[str],
    head: LMHead,
    tied: bool,
) -> Any:
    """PipeBD's heterogeneous model (hf_remote/) of the network's layers, holding its weights."""
    from pipebd_core.workloads.hf_remote.configuration_pipebd import VERSION, PipeBDConfig
    from pipebd_core.workloads.hf_remote.modeling_pipebd import PipeBDForCausalLM

    fields = family_fields(config) | biases(layers)
    gpt2, head_dim = fields["family"] == "gpt2", fields["head_dim"]
    rotary = next((layer.rotary for layer in layers if isinstance(layer, DecoderBlock) and layer.rotary), None)
    remote = PipeBDConfig(
        **fields,
        rope_attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
        rope_dynamic=None if gpt2 else rope_dynamic(config),
        block_configs=[block_config(layer, name, head_dim) for layer, name in zip(layers, names, strict=True)],
        tie_word_embeddings=tied,
        pipebd_version=VERSION,
    )
    remote.auto_map = dict(AUTO_MAP)
    model = PipeBDForCausalLM(remote).float()
    body: Any = model.model
    body.embed_tokens.load_state_dict(embedding.tokens.state_dict())
    if gpt2:
        assert embedding.positions is not None, "GPT-2 embeds positions"
        body.embed_positions.load_state_dict(embedding.positions.state_dict())
    elif rotary is not None:  # dynamic rope's buffer changes with long sequences: its original
        body.rotary_inv_freq.copy_(getattr(rotary, "original_inv_freq", rotary.inv_freq))
    for target, layer in zip(body.layers, layers, strict=True):
        source = layer.layer if isinstance(layer, DecoderBlock) else layer
        (target.linear if isinstance(layer, nn.Linear) else target).load_state_dict(source.state_dict())
    body.norm.load_state_dict(head.norm.state_dict())
    if not tied:
        model.lm_head.load_state_dict(head.projection.state_dict())
    return model


def family_fields(config: Any) -> dict[str, Any]:
    """PipeBDConfig's fields the teacher's config gives: its layout, sizes, norm and activation (a PipeBD
    teacher's are its own)."""
    if config.model_type == MODEL_TYPE:
        names = ("family", "vocab_size", "hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings")
        return {name: getattr(config, name) for name in (*names, "norm_eps", "hidden_act")}
    gpt2, heads = config.model_type == "gpt2", config.num_attention_heads
    return {
        "family": "gpt2" if gpt2 else "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_attention_heads": heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "max_position_embeddings": config.max_position_embeddings,
        "norm_eps": config.layer_norm_epsilon if gpt2 else config.rms_norm_eps,
        "hidden_act": config.activation_function if gpt2 else config.hidden_act,
    }


def rope_type(config: Any) -> str:
    """The teacher's rope scaling type ("default" where it has none)."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(parameters.get("rope_type") or parameters.get("type") or "default")


def check_rope(config: Any) -> None:
    """Refuse a rope scaling PipeBD's remote code does not compute, naming it and the ones it does."""
    if config.model_type in (MODEL_TYPE, "gpt2"):
        return
    kind = rope_type(config)
    if kind not in (*STATIC_ROPE, "dynamic"):
        raise SpecError(
            f"workload.teacher: the teacher's rope scaling {kind!r} is not one PipeBD's Hugging Face directory of"
            f" mixed layers computes ({', '.join((*STATIC_ROPE, 'dynamic'))}); choose replacements that keep every"
            " layer's shape (keep, ffn_P/Q or kv_N alone), whose directory is the teacher's family"
        )


def check_exportable(spec: Spec, config: Any) -> None:
    """Before training: refuse a teacher rope scaling that the job's directory, where it is PipeBD's remote code
    (a search, a replacement its family cannot express, a teacher of PipeBD's own layers), could not carry."""
    names = spec.workload.replacements
    if len(names) > 1 or not (names[0] == "keep" or names[0].startswith(("ffn_", "kv_"))):
        check_rope(config)


def rope_dynamic(config: Any) -> RopeDynamic | None:
    """Dynamic NTK scaling's parameters for the remote code, None for a static rope; other types refused."""
    if config.model_type == MODEL_TYPE:
        dynamic: RopeDynamic | None = config.rope_dynamic
        return dynamic
    check_rope(config)
    if rope_type(config) != "dynamic":
        return None
    parameters = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "rope_theta": float(parameters["rope_theta"]),
        "factor": float(parameters["factor"]),
        "original_max_position_embeddings": int(config.max_position_embeddings),
        "dim": int(head_dim * parameters.get("partial_rotary_factor", 1.0)),
    }


def block_config(layer: nn.Module, name: str, head_dim: int) -> BlockConfig:
    """One layer's description in config.json's block_configs (configuration_pipebd.py)."""
    if isinstance(layer, DecoderBlock):
        inner: Any = layer.layer
        attention = getattr(inner, "self_attn", None) or inner.attn
        kv_heads = attention.k_proj.out_features // head_dim if hasattr(attention, "k_proj") else None
        return {
            "kind": "decoder",
            "replacement": name,
            "attention": "linear" if hasattr(attention, "query_map") else "softmax",
            "num_key_value_heads": kv_heads or attention.config.num_attention_heads,
            "intermediate_size": ffn_width(inner.mlp),
            "scale": float(attention.scaling),
        }
    if isinstance(layer, FFNOnly):
        return {"kind": "ffn_only", "replacement": name, "intermediate_size": ffn_width(layer.mlp)}
    if isinstance(layer, nn.Linear):
        return {"kind": "linear", "replacement": name}
    assert isinstance(layer, nn.Identity), f"layer {name!r} is a {type(layer).__name__}"
    return {"kind": "noop", "replacement": name}


def biases(layers: Sequence[nn.Module]) -> dict[str, bool]:
    """Which of the Llama family's projections carry a bias (Qwen2: q, k and v), read off the layers."""
    found = {"qkv_bias": False, "output_bias": False, "mlp_bias": False}
    modules: list[Any] = [module for layer in layers for module in layer.modules()]
    for module in modules:
        if hasattr(module, "q_proj"):
            found["qkv_bias"] = module.q_proj.bias is not None
            found["output_bias"] = module.o_proj.bias is not None
        if hasattr(module, "gate_proj"):
            found["mlp_bias"] = module.gate_proj.bias is not None
    return found


def special_tokens(spec: Spec, config: Any) -> tuple[int | None, int | None]:
    """(end of document, beginning of sequence) of the data: the byte-level tokenizer's 256 and none, or
    a local tokenizer's end-of-document token and the teacher's bos; the teacher's where the data is not text."""
    if spec.data.dataset != "text":
        return config.eos_token_id, config.bos_token_id
    from pipebd_core.data.text import tokenizer_of

    tokenizer = tokenizer_of(spec)
    return tokenizer.eos, (config.bos_token_id if spec.data.tokenizer else None)


def write_tokenizer(spec: Spec, folder: Path) -> None:
    """The data's tokenizer into `folder`: data.tokenizer's files, or the byte-level one as tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    if spec.data.tokenizer:
        source = Path(spec.data.tokenizer).expanduser()
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, folder / name)
        if not (source / "tokenizer_config.json").is_file():  # a bare tokenizer.json: AutoTokenizer needs a config
            from pipebd_core.data.text import LocalTokenizer

            eos = LocalTokenizer(str(source)).eos
            eos_name = None if eos is None else LocalTokenizer(str(source)).inner.id_to_token(eos)
            bare = PreTrainedTokenizerFast(tokenizer_file=str(source / "tokenizer.json"), eos_token=eos_name)
            bare.save_pretrained(str(folder))
        return
    fast = PreTrainedTokenizerFast(  # split_special_tokens: the text "<|endoftext|>" is its 13 bytes, as in the data
        tokenizer_object=byte_tokenizer(), eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, split_special_tokens=True
    )
    fast.save_pretrained(str(folder))


def byte_tokenizer() -> Any:
    """PipeBD's byte-level tokenization (data/text.py: ByteTokenizer) as a `tokenizers` Tokenizer: UTF-8
    byte b is token b (spelt as GPT-2's printable stand-in for it), EOS_TOKEN is 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from pipebd_core.data.text import BYTE_EOS

    vocab = {character: byte for byte, character in enumerate(byte_characters())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    assert tokenizer.token_to_id(EOS_TOKEN) == BYTE_EOS, "the end of document follows the 256 bytes"
    return tokenizer


def byte_characters() -> list[str]:
    """The printable character that byte-level tokenizers (GPT-2's) spell each byte 0..255 with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[byte] = chr(byte)
        else:
            characters[byte] = chr(256 + extra)
            extra += 1
    return [characters[byte] for byte in range(256)]
