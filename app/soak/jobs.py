"""The soak's jobs: tiny specs of each kind it submits (seconds each on a CPU, a few for minutes), and the
bad requests it mixes in among the good ones (each must be refused with a 4xx, never a 5xx).

Besides the custom workload on 1, 2 and 3 ranks, on 2 nodes and in sweeps: a compression job (a VGG-11 student,
one step), an architecture search (a quarter-width MobileNetV2 supernet, architecture updated mid-run), a
transformer search (a 4-layer random Llama, three candidates per layer, within half its parameters) on a text
folder the soak writes (`write_text`), and a job that trains end to end and then finetunes (3 steps)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {  # a BN-free custom workload: any mode in seconds
    "workload": {"kind": "custom", "factory": "pipebd_core.workloads.tiny:make_blocks", "options": {}},
    "data": {"dataset": "synthetic", "image_size": 8, "num_samples": 40, "batch_size": 10},
    "train": {"epochs": 1, "lr": 0.05, "seed": 3},
    "schedule": {"mode": "tr_dpu", "nproc": 2, "profile": False},
}


def spec(name: str, **sections: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(TINY)
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return {**document, "name": name}


# kind -> (its spec, its weight in the mix)
KINDS: dict[str, tuple[dict[str, Any], float]] = {
    "custom": (spec("soak-custom"), 3.0),
    "custom_1rank": (spec("soak-one-rank", schedule={"nproc": 1}), 1.0),
    # long enough to be paused, cancelled or killed mid-distillation; checkpointed often to resume
    "long": (spec("soak-long", data={"num_samples": 200}, train={"epochs": 8, "checkpoint_every": 4}), 2.0),
    "hybrid": (
        spec(
            "soak-hybrid",
            schedule={
                "mode": "hybrid",
                "nproc": 3,
                "stages": [{"start": 0, "stop": 1, "replicas": 2}, {"start": 1, "stop": 4, "replicas": 1}],
            },
        ),
        0.5,
    ),
    "two_node": (spec("soak-two-nodes", schedule={"nproc": 1, "nodes": 2}), 0.7),
}
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 260,
    "max_position_embeddings": 64,
}
TEXT = "blockwise distillation trains every student block against its teacher block's output. "
TEXT_FOLDER = "soak-text"  # under the service's <data_dir>/datasets (a data root by default)


def write_text(datasets: Path) -> Path:
    """The transformer search's text: a few dozen byte sequences of 8 tokens."""
    folder = datasets / TEXT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text(TEXT * 8)
    return folder


def more_kinds(text: Path) -> dict[str, tuple[dict[str, Any], float]]:
    """The kinds beyond the custom workload: compression, NAS, transformer search, train then finetune."""
    return {
        "compression": (
            {
                "name": "soak-compression",
                "workload": {"kind": "compression", "teacher": "vgg11", "granularity": "stage"},
                "data": {"dataset": "synthetic", "image_size": 32, "num_samples": 8, "batch_size": 4},
                "train": {"epochs": 1, "max_steps": 1, "seed": 3},
                "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
            },
            0.5,
        ),
        "nas": (
            {
                "name": "soak-nas",
                "workload": {
                    "kind": "nas",
                    "width_mult": 0.25,
                    "layers_per_block": [2, 2, 2, 2, 2, 1],
                    "student_norm": "batch",
                    "arch_update_every": 2,
                    "arch_lr": 0.05,
                },  # seed 0: BatchNorm and ReLU6 rerun bit-stably (tests/ranks/test_nas.py)
                "data": {"dataset": "synthetic", "image_size": 16, "num_samples": 44, "batch_size": 11},
                "train": {"epochs": 1, "lr": 0.05, "seed": 0},
                "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
            },
            0.5,
        ),
        "transformer": (
            {
                "name": "soak-transformer-search",
                "workload": {
                    "kind": "transformer",
                    "config": TINY_LLAMA,
                    "replacements": ["keep", "ffn_1/2", "noop"],
                    "budget": {"params": 0.5},
                },
                "data": {"dataset": "text", "root": str(text), "seq_len": 8, "batch_size": 9, "eval_samples": 16},
                "train": {"epochs": 1, "max_steps": 3, "lr": 0.05, "seed": 3},
                "schedule": {"mode": "tr_dpu", "nproc": 2, "profile": False},
            },
            0.5,
        ),
        "finetune": (
            {
                "name": "soak-finetune",
                "workload": {"kind": "train", "factory": "pipebd_core.workloads.tiny:make_network", "options": {}},
                "data": {"dataset": "digits", "image_size": 8, "batch_size": 12, "eval_samples": 60},
                "train": {"seed": 3},
                "schedule": {"nproc": 2, "profile": False},
                "finetune": {"strategy": "ddp", "epochs": 1, "max_steps": 3, "lr": 0.2, "profile": False},
            },
            0.5,
        ),
    }


SWEEP_KIND = "sweep"
SWEEP_WEIGHT = 0.4
SWEEP_GRID = {"train.lr": [0.02, 0.05]}

BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [  # (method, path, httpx keyword arguments)
    ("POST", "/api/v1/jobs", {"json": {}}),
    ("POST", "/api/v1/jobs", {"json": spec("bad", schedule={"mode": "warp"})}),
    ("POST", "/api/v1/jobs", {"json": spec("bad", data={"batch_size": -3})}),
    ("POST", "/api/v1/jobs", {"content": b"{not json", "headers": {"Content-Type": "application/json"}}),
    ("POST", "/api/v1/jobs", {"content": b"name: [unclosed", "headers": {"Content-Type": "application/yaml"}}),
    ("GET", "/api/v1/jobs/999999999", {}),
    ("GET", "/api/v1/jobs/99999999999999999999", {}),
    ("POST", "/api/v1/jobs/999999999/resume", {}),
    ("GET", "/api/v1/jobs", {"params": {"limit": -1}}),
    ("GET", "/api/v1/jobs", {"params": {"cursor": "not-a-cursor"}}),
    ("POST", "/api/v1/sweeps", {"json": {"spec": spec("bad-sweep"), "grid": {"train.nope": [1, 2]}}}),
    ("POST", "/api/v1/webhooks", {"json": {"url": "ftp://127.0.0.1:9/hook", "events": ["job.nope"]}}),
]
