"""Profiles on disk: keyed by workload, data (its loader workers included), batch size, device kind
and count, so planning again is instant. A missing profile is measured by a torchrun job of
`pipebd_core.planning.profiler`, started (like the training job) in a session of its own so the whole tree
can be stopped at once. A caller that must be able to stop it from elsewhere (the service's worker,
on cancel or shutdown; the reaper, when the worker died) wraps the call in `watch_profiling`: the
profiling job then runs in the folder it names and reports its torchrun process when it starts and
ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipebd_core.planning.profiler import PROFILE_FILE
from pipebd_core.processes import rank_environment, stop_process_tree, torchrun_command
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

CACHE_ENV = "PIPEBD_CACHE_DIR"
PROFILE_TIMEOUT_S = 1800
FORMAT_VERSION = 1


class ProfileError(RuntimeError):
    """The profiling job failed; the message carries the failing rank's error."""


ProcessHook = Callable[[subprocess.Popen[bytes]], None]


@dataclass(frozen=True)
class ProfilingWatch:
    """How a caller follows the profiling job that `measure` may start in its thread."""

    folder: Path  # the profiling run's folder: every one of its processes names it on its command line
    started: ProcessHook  # called with the torchrun agent (leader of its own session) once it runs
    ended: ProcessHook  # called after it exited or was stopped
    extra_env: dict[str, str] = field(default_factory=dict)  # for the ranks too (a worker's devices)


_WATCH: ContextVar[ProfilingWatch | None] = ContextVar("pipebd_profiling_watch", default=None)


@contextlib.contextmanager
def watch_profiling(watch: ProfilingWatch) -> Iterator[None]:
    """Profiling jobs started by this thread inside the block are reported to `watch`."""
    token = _WATCH.set(watch)
    try:
        yield
    finally:
        _WATCH.reset(token)


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


def measure(spec: Spec, trials: int = 5) -> dict[str, Any]:
    """Run the profiler with torchrun on `spec.schedule.nproc` ranks and return the profile."""
    watch = _WATCH.get()
    if watch is None:
        folder = Path(tempfile.mkdtemp(prefix="pipebd-profile-"))
    else:
        folder = watch.folder
        folder.mkdir(parents=True, exist_ok=True)
    run_dir = RunDir(folder)
    try:
        run_dir.write_json(run_dir.spec, spec.model_dump(mode="json"))
        command = torchrun_command(
            spec.schedule.nproc, run_dir, "pipebd_core.planning.profiler", "--trials", str(trials)
        )
        with (folder / "launcher.log").open("wb") as log:
            process = subprocess.Popen(
                command,
                env=rank_environment(spec, run_dir, watch.extra_env if watch else None),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole, never half
            )
        code = wait_profiler(process, watch)
        if code != 0:
            errors = run_dir.rank_errors()
            detail = errors[0]["traceback"] if errors else (folder / "launcher.log").read_text()[-3000:]
            raise ProfileError(f"profiling failed (exit code {code}):\n{detail}")
        return json.loads((folder / PROFILE_FILE).read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wait_profiler(process: subprocess.Popen[bytes], watch: ProfilingWatch | None) -> int:
    """The profiling job's exit code; it never outlives this call (timeout, Ctrl-C, a failing hook)."""
    try:
        if watch is not None:
            watch.started(process)
        try:
            return process.wait(timeout=PROFILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_process_tree(process)
            raise ProfileError(f"profiling took longer than {PROFILE_TIMEOUT_S} s and was stopped") from None
    finally:
        if process.poll() is None:
            stop_process_tree(process)
        if watch is not None:
            watch.ended(process)


def obtain_profile(spec: Spec, refresh: bool = False, trials: int = 5) -> tuple[dict[str, Any], bool]:
    """(profile, whether it came from the cache); measures and caches it when needed."""
    cached = None if refresh else load_cached(spec)
    if cached is not None:
        return cached, True
    profile = measure(spec, trials)
    path = cache_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(profile, indent=1))
    temporary.replace(path)
    return profile, False
