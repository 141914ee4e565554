"""The CUDA devices this machine has, asked without importing torch where it has none.

The processes that supervise jobs (a Celery worker, `pipebd run`'s launch checks, the profile cache's key)
need to know whether there are GPUs, and nothing else of torch: on a machine without an NVIDIA driver
(no /proc/driver/nvidia, nor WSL's /dev/dxg) or with CUDA_VISIBLE_DEVICES hiding every device there are
none, and torch (2-3 s of CPU to import, 700 MiB resident) is not imported to say so. Where a driver is
present, torch answers, as before.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

DRIVER_PATHS = (Path("/proc/driver/nvidia"), Path("/dev/dxg"))  # Linux's NVIDIA driver, WSL's GPU bridge
HIDDEN = ("", "-1")  # CUDA_VISIBLE_DEVICES values that hide every device


def _may_have_cuda() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in HIDDEN:
        return False
    return any(path.exists() for path in DRIVER_PATHS)


def cuda_available() -> bool:
    """Whether torch would find a usable CUDA device (without importing it where there can be none)."""
    if not _may_have_cuda():
        return False
    import torch

    return torch.cuda.is_available()


def cuda_count() -> int:
    """How many CUDA devices torch would see (0 where there are none)."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


def cuda_name() -> str:
    """The first CUDA device's name; call only where `cuda_available()`."""
    import torch

    return torch.cuda.get_device_name(0)


def torch_version() -> str:
    """The installed torch's version, read from its package metadata (without importing it)."""
    return importlib.metadata.version("torch")
