"""The profile cache: profiles on disk, keyed by workload, data (its loader workers included), batch
size, device kind and count, so planning again is instant.

Measuring is the job's `profile` phase (pipebd_core.planning.profiler under the supervisor); this
module only names, reads and writes the cached results.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from pipebd_core.spec import Spec

CACHE_ENV = "PIPEBD_CACHE_DIR"
FORMAT_VERSION = 1


class ProfileError(RuntimeError):
    """No profile could be had; the message says why (the profiling job's error, a missing file)."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "pipebd"))


def device_kind(spec: Spec) -> str:
    if spec.schedule.device != "cpu" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"cpu:{spec.schedule.threads_per_rank}-threads"


def profile_key(spec: Spec) -> str:
    """What the measurements depend on; the spec's training and schedule fields (but nproc) do not count.
    `data.num_workers` does: the profile's data-loading times are measured with that many loader workers."""
    key = {
        "version": FORMAT_VERSION,
        "torch": torch.__version__,
        "workload": spec.workload.model_dump(mode="json"),
        "data": spec.data.model_dump(
            mode="json", include={"dataset", "root", "factory", "options", "image_size", "num_workers"}
        ),
        "batch_size": spec.data.batch_size,
        "device": device_kind(spec),
        "nproc": spec.schedule.nproc,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def cache_path(spec: Spec) -> Path:
    return cache_root() / "profiles" / f"{spec.name}-{profile_key(spec)}.json"


def load_cached(spec: Spec) -> dict[str, Any] | None:
    path = cache_path(spec)
    return json.loads(path.read_text()) if path.exists() else None


def store(spec: Spec, profile: dict[str, Any]) -> Path:
    """Cache a measured profile (atomically); returns where it lies."""
    path = cache_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(profile, indent=1))
    temporary.replace(path)
    return path


def describe_cached(profile: dict[str, Any], spec: Spec) -> str:
    """Why a profile phase was skipped: which cached profile it reuses and how old it is."""
    age = time.time() - float(profile.get("measured_at", time.time()))
    return f"cached profile {cache_path(spec).name}, measured {age / 60:.0f} min ago"
