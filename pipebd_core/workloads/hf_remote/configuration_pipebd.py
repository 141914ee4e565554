"""PipeBD's heterogeneous decoder: its configuration (written by PipeBD, loaded through `auto_map`).

One block description per decoder layer in `block_configs`, each a dict (Nemotron-51B's DeciLM form):

    {"kind": "decoder", "attention": "softmax", "num_key_value_heads": 2, "intermediate_size": 32}
    {"kind": "decoder", "attention": "linear", "num_key_value_heads": 2, "intermediate_size": 32}
    {"kind": "ffn_only", "intermediate_size": 32}      a layer without its attention: x + FFN(norm(x))
    {"kind": "linear"}                                 one linear map of the hidden state
    {"kind": "noop"}                                   the hidden state passes through

with `replacement` naming the PipeBD replacement it came from and `scale` the softmax attention's scale.
`family` is the teacher's layer layout: "llama" (RMSNorm, rotary embeddings, gated FFN: Llama, Qwen2,
Mistral) or "gpt2" (LayerNorm, learned positions, fused QKV and Conv1D weights).

Rotary embeddings are the teacher's inverse frequencies (a buffer in model.safetensors) times
`rope_attention_scaling`, which is every static rope scaling (default, linear, llama3, yarn); `rope_dynamic`
({"rope_theta", "factor", "original_max_position_embeddings", "dim"}) is dynamic NTK scaling, the frequencies
recomputed from the sequence length beyond the original positions as transformers' Llama does.

Versions: 1 wrote block_configs and took batches without padding; 2 takes padded batches (attention_mask)
and adds `rope_dynamic`.
"""

from __future__ import annotations

from typing import Any, Required, TypedDict

from transformers import PretrainedConfig

VERSION = "2"  # of these two modules; config.json's pipebd_version names the one that wrote it
KINDS = ("decoder", "ffn_only", "linear", "noop")
FAMILIES = ("llama", "gpt2")


class BlockConfig(TypedDict, total=False):
    """One decoder layer's description in `block_configs` (the forms above)."""

    kind: Required[str]  # one of KINDS
    replacement: str  # the PipeBD replacement it came from
    attention: str  # decoder: softmax or linear
    num_key_value_heads: int  # decoder
    intermediate_size: int  # decoder and ffn_only: the FFN's width
    scale: float  # decoder: the softmax attention's scale


class RopeDynamic(TypedDict):
    """Dynamic NTK scaling's parameters (`rope_dynamic`)."""

    rope_theta: float
    factor: float
    original_max_position_embeddings: int
    dim: int


class PipeBDConfig(PretrainedConfig):
    model_type = "pipebd"

    def __init__(
        self,
        family: str = "llama",
        vocab_size: int = 257,
        hidden_size: int = 16,
        num_attention_heads: int = 4,
        head_dim: int | None = None,
        max_position_embeddings: int = 2048,
        norm_eps: float = 1e-6,
        hidden_act: str = "silu",
        qkv_bias: bool = False,
        output_bias: bool = False,
        mlp_bias: bool = False,
        rope_attention_scaling: float = 1.0,
        rope_dynamic: RopeDynamic | None = None,
        block_configs: list[BlockConfig] | None = None,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        pipebd_version: str = VERSION,
        **kwargs: Any,
    ) -> None:
        if family not in FAMILIES:
            raise ValueError(f"family {family!r} is not one of {FAMILIES}")
        self.family = family
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.norm_eps = norm_eps
        self.hidden_act = hidden_act
        self.qkv_bias, self.output_bias, self.mlp_bias = qkv_bias, output_bias, mlp_bias
        self.rope_attention_scaling = rope_attention_scaling
        self.rope_dynamic = rope_dynamic
        self.block_configs = list(block_configs or [])
        for index, block in enumerate(self.block_configs):
            if block.get("kind") not in KINDS:
                raise ValueError(f"block_configs[{index}]: kind {block.get('kind')!r} is not one of {KINDS}")
        self.num_hidden_layers = len(self.block_configs)
        self.use_cache = use_cache
        self.pipebd_version = pipebd_version
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)
