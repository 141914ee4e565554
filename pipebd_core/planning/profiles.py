"""The profile caches: block profiles (distillation) and layer profiles (end-to-end training) on disk,
keyed by what the measurements depend on (workload, data and its loader workers, batch sizes, device
kind and count; for layers also the micro-batches and, for a searched network, its architecture), so
planning again is instant.

Measuring is a phase (`profile`: pipebd_core.profile.blocks, `profile_finetune`:
pipebd_core.profile.layers, under the supervisor); this module names, reads and writes the
cached results. An entry this PipeBD cannot read (written before profiles had a format version, or
of another one) is a cache miss: the profile phase measures again and replaces it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TypeVar

from pipebd_core import devices
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import Profile
from pipebd_core.spec import Spec

CACHE_ENV = "PIPEBD_CACHE_DIR"
# 4 and 3: measured by ranks that keep the memory they free (job/processes.py's RANK_ALLOCATOR)
FORMAT_VERSION = 5  # 2: the replicated student step (student_group_s); 3: a search's candidates' forward;
# 5: the blocks' work one after another (chain_s)
LAYER_FORMAT_VERSION = 6  # 2: backward times without their forward, input and weight bytes, split kernels;
# 4: the co-run curve (co_run); 5: the optimiser's co-run curve (co_run_optim); 6: noisy parts taken again,
# the all-reduce pooled from three attempts (profile/layers.py)


Cached = TypeVar("Cached", Profile, LayerProfile)


class ProfileError(RuntimeError):
    """No profile could be had; the message says why (the profiling job's error, a missing file)."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "pipebd"))


def device_kind(spec: Spec) -> str:
    if spec.schedule.device != "cpu" and devices.cuda_available():
        return f"cuda:{devices.cuda_name()}"
    return f"cpu:{spec.schedule.threads_per_rank}-threads"


_DATA_KEYS = {"dataset", "root", "factory", "options", "image_size", "num_workers", "seq_len", "tokenizer"}


def profile_key(spec: Spec) -> str:
    """What the measurements depend on; the spec's training and schedule fields (but nproc and nodes) do not count.
    `data.num_workers` does: the profile's data-loading times are measured with that many loader workers."""
    key = {
        "version": FORMAT_VERSION,
        "torch": devices.torch_version(),
        "workload": spec.workload.model_dump(mode="json"),
        "data": spec.data.model_dump(mode="json", include=_DATA_KEYS),
        "batch_size": spec.data.batch_size,
        "device": device_kind(spec),
        "nproc": spec.schedule.nproc,
        **({"nodes": spec.schedule.nodes} if spec.schedule.nodes > 1 else {}),  # measured across them
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def layer_profile_key(spec: Spec, architecture: str | None) -> str:
    """What the layer measurements depend on: the block profile's key, the finetune batch and micro-batches,
    the optimiser's settings that change its step's work (momentum, weight decay), the initialisation's source,
    and a searched network's architecture (architecture.json's text)."""
    tune = spec.finetune
    assert tune is not None, "only a spec with a finetune section has layers to profile"
    key = {
        "layers": LAYER_FORMAT_VERSION,
        "blocks": profile_key(spec),
        "batch": tune.batch_size or spec.data.batch_size,
        "microbatches": tune.microbatches,
        "optimizer": {"momentum": tune.momentum, "weight_decay": tune.weight_decay},
        "architecture": architecture,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def cache_path(spec: Spec, architecture: str | None = None, layers: bool = False) -> Path:
    """The cache file of `spec`'s block profile, or (`layers`) of its layer profile."""
    if layers:
        return cache_root() / "layer-profiles" / f"{spec.name}-{layer_profile_key(spec, architecture)}.json"
    return cache_root() / "profiles" / f"{spec.name}-{profile_key(spec)}.json"


def load_cached(spec: Spec) -> Profile | None:
    """`spec`'s cached block profile; None when there is none, or only one this PipeBD cannot read (an
    entry of another format version, or of none: written before profiles were versioned), which is
    then measured again."""
    return _read(cache_path(spec), Profile)


def load_cached_layers(spec: Spec, architecture: str | None) -> LayerProfile | None:
    """`spec`'s cached layer profile, like `load_cached`."""
    return _read(cache_path(spec, architecture, layers=True), LayerProfile)


def _read(path: Path, kind: type[Cached]) -> Cached | None:
    if not path.exists():
        return None
    try:
        return kind.from_json(json.loads(path.read_text()))
    except (DocumentError, json.JSONDecodeError):
        return None  # a cache miss: profiled again, and this entry replaced


def store(spec: Spec, profile: Profile | LayerProfile, architecture: str | None = None) -> Path:
    """Cache a measured profile (atomically); returns where it lies."""
    path = cache_path(spec, architecture, layers=isinstance(profile, LayerProfile))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(profile.to_json(), indent=1))
    temporary.replace(path)
    return path


def describe_cached(profile: Profile | LayerProfile, path: Path) -> str:
    """Why a profile phase was skipped: which cached profile it reuses and how old it is."""
    measured_at = time.time() if profile.measured_at is None else profile.measured_at
    return f"cached profile {path.name}, measured {(time.time() - measured_at) / 60:.0f} min ago"
