"""A tiny random Llama (Qwen2, GPT-2) teacher on a small text folder, a budgeted search of it, and a tiny random
vision transformer on digits: the transformer workload's test specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "vocab_size": 260, "n_positions": 32}

TINY_QWEN2 = {  # Qwen2: biased q, k and v projections
    "model_type": "qwen2",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 260,
    "max_position_embeddings": 64,
}

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 260,  # the byte-level tokenizer's 257 ids fit
    "max_position_embeddings": 64,
}


def write_text(folder: Path) -> Path:
    """A .txt and a .jsonl file of plain English, enough for a few dozen byte sequences of 8 tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    sentence = "blockwise distillation trains every student block against its teacher block's output"
    (folder / "a.txt").write_text(" ".join([sentence] * 6))
    lines = [f'{{"text": "{sentence[::-1]} {i}"}}' for i in range(4)]
    (folder / "b.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def transformer_document(root: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """Four decoder layers, sequences of 8 byte tokens, batches of 9 (uneven over 2 ranks), 3 steps."""
    document: dict[str, Any] = {
        "name": "tiny-llama",
        "workload": {"kind": "transformer", "config": TINY_LLAMA, "replacements": ["ffn_1/2"]},
        "data": {"dataset": "text", "root": str(root), "seq_len": 8, "batch_size": 9, "eval_samples": 16},
        "train": {"epochs": 1, "max_steps": 3, "lr": 0.05, "seed": 3},
        "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
    }
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return document


LLAMA_SEARCH = ["keep", "ffn_1/4", "kv_1", "linear_attention", "no_attention", "linear", "noop"]  # every kind
LLAMA_SEARCH_BUDGET = {"params": 0.5, "kv_cache": 0.2}


def llama_search_document(root: Path, budget: dict[str, float] = LLAMA_SEARCH_BUDGET) -> dict[str, Any]:
    """A Llama search over every replacement kind within `budget` (half the parameters and a fifth of the KV
    cache unless given), 2 steps, then two steps of fine-tuning: test_hf_directories.py's search, which
    test_choose_again.py chooses from again (`finished_run` runs it once for both)."""
    document = transformer_document(root, train={"max_steps": 2})
    document["workload"]["replacements"] = LLAMA_SEARCH
    document["workload"]["budget"] = budget
    document["finetune"] = {"strategy": "ddp", "epochs": 1, "max_steps": 2, "lr": 0.05, "profile": False}
    return document


TINY_VIT = {  # torchvision's VisionTransformer: 16x16 images in 4x4 patches, 17 tokens of 16 features
    "model_type": "vision_transformer",
    "patch_size": 4,
    "num_layers": 4,
    "num_heads": 4,
    "hidden_dim": 16,
    "mlp_dim": 32,
}


def vit_document(**sections: dict[str, Any]) -> dict[str, Any]:
    """Four encoder layers on scikit-learn's digits at 16x16, batches of 9 (uneven over 2 ranks), 3 steps."""
    document: dict[str, Any] = {
        "name": "tiny-vit",
        "workload": {"kind": "transformer", "config": TINY_VIT, "replacements": ["ffn_1/2"]},
        "data": {"dataset": "digits", "image_size": 16, "batch_size": 9, "eval_samples": 32},
        "train": {"epochs": 1, "max_steps": 3, "lr": 0.05, "seed": 3},
        "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
    }
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return document
