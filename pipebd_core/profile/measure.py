"""How the profilers time things: warm-up, trials and their summary, the bytes a module saves for its
backward, when trials disagree (`NOISY_SPREAD`), and the link fit of measured transfers."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipebd_core.documents.profile import LinkFit, Timing


def fit_link(points: Sequence[tuple[int, float]]) -> LinkFit | None:
    """latency + bytes / bandwidth through measured (bytes, seconds) sends, by least squares (the latency
    kept >= 0); None without two distinct sizes. Where time does not grow with bytes (sizes too small for
    the bandwidth to show, or noise larger than it), the link is latency-bound over these sizes: its median
    send, with the bandwidth bounded below by the largest send over that median (never a free link)."""
    sizes = {size for size, _ in points}
    if len(sizes) < 2:
        return None
    count = len(points)
    mean_x = sum(size for size, _ in points) / count
    mean_y = sum(seconds for _, seconds in points) / count
    covariance = sum((size - mean_x) * (seconds - mean_y) for size, seconds in points)
    variance = sum((size - mean_x) ** 2 for size, _ in points)
    slope = covariance / variance
    if slope <= 0:
        latency = statistics.median(seconds for _, seconds in points)
        if latency <= 0:
            return None
        kept = [(int(s), float(t)) for s, t in points]
        return LinkFit(latency_s=latency, bytes_per_s=max(sizes) / latency, points=kept, latency_bound=True)
    latency = mean_y - slope * mean_x
    if latency < 0:  # through the origin instead
        latency, slope = 0.0, sum(size * seconds for size, seconds in points) / sum(size**2 for size, _ in points)
    return LinkFit(latency_s=latency, bytes_per_s=1.0 / slope, points=[(int(s), float(t)) for s, t in points])


NOISY_SPREAD = 0.5  # (p90 - p10) / median of a measurement's trials above this: they disagree
MAX_REMEASURES = 2  # extra attempts at a measurement whose trials disagree


WARMUP = 1


def timed_once(fn: Callable[[], Any], trials: int, device: torch.device) -> list[float]:
    """Wall-clock seconds of `trials` calls after `WARMUP` untimed ones (synchronising on CUDA)."""
    samples = []
    for index in range(WARMUP + trials):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= WARMUP:
            samples.append(time.perf_counter() - started)
    return samples


def steadiest(take: Callable[[], list[float]]) -> tuple[list[float], int]:
    """A measurement's trials (`take()`), taken again (at most MAX_REMEASURES times) while they disagree, and
    the steadiest attempt kept; with how many times it was taken again. For a measurement a rank takes alone:
    ranks that run a collective together must take the same trials."""
    attempts = [take()]
    while spread_of(attempts[-1]) > NOISY_SPREAD and len(attempts) <= MAX_REMEASURES:
        attempts.append(take())
    return min(attempts, key=spread_of), len(attempts) - 1


def saved_bytes(student: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for the student's backward at this batch (what its training adds to memory)."""
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = student(x)
    return total[0] + output.numel() * output.element_size()


def summarise(samples: list[float], remeasured: int = 0) -> Timing:
    return Timing(
        median=statistics.median(samples), spread=spread_of(samples), trials=len(samples), remeasured=remeasured
    )


def spread_of(samples: list[float]) -> float:
    """(p90 - p10) / median of the trials: 0 when they agree."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    low, high = ordered[int(0.1 * (len(ordered) - 1))], ordered[round(0.9 * (len(ordered) - 1))]
    return (high - low) / median if median > 0 else 0.0


def ping_pong(buffer: torch.Tensor, peer: int, first: bool) -> None:
    """One round trip of `buffer` with `peer` (`first`: this rank sends first)."""
    if first:
        dist.send(buffer, peer)
        dist.recv(buffer, peer)
    else:
        dist.recv(buffer, peer)
        dist.send(buffer, peer)
