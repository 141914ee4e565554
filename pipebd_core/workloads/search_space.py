"""The NAS search space: the candidates of every searchable layer, and their names.

Apart from the supernet (workloads/supernet.py) so that readers of the search's telemetry (the
dashboard's heat maps) can name candidates without importing torch.
"""

from __future__ import annotations

CANDIDATES = ((3, 3), (3, 6), (5, 3), (5, 6), (7, 3), (7, 6))  # MBConv (kernel, expansion)
ZERO = "zero"  # the candidate that skips a layer (where it keeps stride 1 and its width)


def candidate_name(kernel: int, expansion: int) -> str:
    return f"mbconv_k{kernel}_e{expansion}"
