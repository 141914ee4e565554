"""The soak's jobs: tiny specs of each kind it submits (seconds each on a CPU, a few for minutes), and the
bad requests it mixes in among the good ones (each must be refused with a 4xx, never a 5xx)."""

from __future__ import annotations

import copy
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
