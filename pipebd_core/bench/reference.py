"""The machine's reference speed: two fixed kernels on one thread, in GFLOP/s, measured at the start and
the end of every bench and kept in its record.

Two records whose CPU model strings read alike ("AMD EPYC") can still come from machines of different
speed; the reference speed tells them apart, and a bench whose end speed differs from its start speed
ran on a machine that changed under it. The kernels: a matrix product (MATMUL_SIZE cubed, 2 n^3 FLOP)
and a 3 x 3 convolution (CONV_SHAPE, 2 x its multiply-adds), each run REPS times a trial, the median of
TRIALS trials, on one torch thread (the thread count is restored after). `slowdown` runs each kernel
that many times for every time it is counted: a machine that many times slower, for the test that the
figure follows the machine's speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from pipebd_core.documents.bench_record import KernelSpeed

MATMUL_SIZE = 256  # a 256 x 256 by 256 x 256 product: about 34 MFLOP, well inside a core's caches
CONV_SHAPE = (1, 32, 32, 32)  # batch, channels in and out, height = width; a 3 x 3 kernel, padding 1
REPS = 8  # kernel calls a trial
TRIALS = 5  # trials a kernel; the median counts


@contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gflops(
    kernel: Callable[[], object], flop: float, slowdown: int = 1, clock: Callable[[], float] = time.perf_counter
) -> float:
    """GFLOP/s of `kernel` (`flop` a call): the median of TRIALS trials of REPS counted calls, each call
    run `slowdown` times, timed by `clock` (seconds)."""
    if slowdown < 1:
        raise ValueError(f"reference speed: slowdown {slowdown}; give 1 (none) or more")
    kernel()  # first touch: allocations and the kernel's choice
    seconds = []
    for _ in range(TRIALS):
        started = clock()
        for _ in range(REPS * slowdown):
            kernel()
        seconds.append(clock() - started)
    return flop * REPS / statistics.median(seconds) / 1e9


def reference_speed(slowdown: int = 1) -> KernelSpeed:
    """The matmul's and the convolution's GFLOP/s on one thread (see the module)."""
    generator = torch.Generator().manual_seed(0)
    n = MATMUL_SIZE
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    batch, channels, side = CONV_SHAPE[0], CONV_SHAPE[1], CONV_SHAPE[3]
    image = torch.randn(batch, channels, side, side, generator=generator)
    weight = torch.randn(channels, channels, 3, 3, generator=generator)
    conv_flop = 2.0 * batch * channels * channels * 9 * side * side
    with one_thread(), torch.no_grad():
        matmul = gflops(lambda: torch.mm(a, b), 2.0 * n**3, slowdown)
        conv = gflops(lambda: torch.nn.functional.conv2d(image, weight, padding=1), conv_flop, slowdown)
    return KernelSpeed(matmul_gflops=matmul, conv_gflops=conv)
