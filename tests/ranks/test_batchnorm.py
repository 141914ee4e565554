"""Cross-rank BatchNorm (pipebd_core/rank/batchnorm.py) equals one nn.BatchNorm on the concatenated batch.

Tier: real gloo process groups. One spawn of 2 ranks and one of 3 run every case of their world size
(torch.multiprocessing) and save what each rank computed; the oracle, one nn.BatchNorm on the whole
batch, runs in the test process. The pure combination of shard statistics is tested in-process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from pipebd_core.rank.batchnorm import (
    LOCAL_BATCHNORM_ENV,
    CrossRankBatchNorm,
    combine_moments,
    convert,
    shard_moments,
    with_sync_batchnorm,
)

TOLERANCE = 1e-6  # relative to the largest magnitude of the expected tensor


@dataclass(frozen=True)
class Case:
    """A BatchNorm layer trained on `steps` batches split `rows` over the ranks, then one eval batch."""

    name: str
    rows: tuple[int, ...]  # rows of each rank's shard, rank order (unequal on purpose)
    shape: tuple[int, ...]  # one sample: (C,), (C, L) or (C, H, W)
    offsets: tuple[float, ...]  # added to each shard's rows, so that shard means differ
    kind: type[nn.Module] = nn.BatchNorm2d
    options: dict[str, Any] = field(default_factory=dict)
    steps: int = 3

    @property
    def world(self) -> int:
        return len(self.rows)


CASES = [
    Case("2d-7+8", (7, 8), (3, 4, 4), (3.0, -2.0)),
    Case("2d-2+5+3", (2, 5, 3), (4, 3, 3), (1.0, -1.5, 4.0)),
    Case("1d-flat-4+9", (4, 9), (5,), (-2.0, 2.0), kind=nn.BatchNorm1d),
    Case("1d-sequence-3+3+4", (3, 3, 4), (5, 6), (0.5, -0.5, 2.0), kind=nn.BatchNorm1d),
    Case("2d-no-affine", (7, 8), (3, 4, 4), (3.0, -2.0), options={"affine": False}),
    Case("2d-no-running-stats", (2, 5, 3), (4, 3, 3), (1.0, -1.5, 4.0), options={"track_running_stats": False}),
    Case("2d-momentum-none", (7, 8), (3, 4, 4), (3.0, -2.0), options={"momentum": None}, steps=4),
    Case("2d-large-mean", (7, 8), (3, 4, 4), (1e4, 1e4 + 0.5)),
]


def batch(case: Case, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch and MSE target of one step (step == case.steps: the eval batch)."""
    generator = torch.Generator().manual_seed(1000 * CASES.index(case) + step)
    rows = sum(case.rows)
    x = torch.randn(rows, *case.shape, generator=generator) * (1.0 + 0.5 * step)
    bounds = torch.tensor([0, *case.rows]).cumsum(0).tolist()
    for offset, start, stop in zip(case.offsets, bounds[:-1], bounds[1:], strict=True):
        x[start:stop] += offset
    return x, torch.randn(rows, *case.shape, generator=generator)


def exercise(norm: nn.Module, case: Case, rows: slice, share: float, dtype: torch.dtype) -> dict[str, Any]:
    """Train `norm` as the runtime trains a student (shard loss weighted by its share), then evaluate it."""
    for step in range(case.steps):
        norm.train().zero_grad(set_to_none=True)
        x, target = batch(case, step)
        inputs = x[rows].to(dtype).requires_grad_()
        output = norm(inputs)
        (F.mse_loss(output, target[rows].to(dtype)) * share).backward()
    result: dict[str, Any] = {"output": output.detach(), "grad_input": inputs.grad}
    if norm.weight is not None:
        result.update(grad_weight=norm.weight.grad, grad_bias=norm.bias.grad)
    result.update({name: buffer.clone() for name, buffer in norm.named_buffers()})
    with torch.no_grad():
        result["eval_output"] = norm.eval()(batch(case, case.steps)[0][rows].to(dtype))
    return result


def oracle(case: Case, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    return exercise(case.kind(case.shape[0], **case.options).to(dtype), case, slice(None), 1.0, dtype)


class Collectives:
    """Counts the collectives the process issues (wraps torch.distributed's all_gather and all_reduce)."""

    def __init__(self) -> None:
        self.calls = {"all_gather": 0, "all_reduce": 0}
        for name in self.calls:
            original = getattr(dist, name)

            def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                self.calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)

    def since(self, before: dict[str, int]) -> dict[str, int]:
        return {name: count - before[name] for name, count in self.calls.items()}


def communication(collectives: Collectives, rank: int) -> dict[str, dict[str, int]]:
    """Collectives issued by one training step, an eval forward, and an eval forward without running stats."""
    counts = {}
    for label, options, training in (
        ("train", {}, True),
        ("eval", {}, False),
        ("eval-no-running-stats", {"track_running_stats": False}, False),
    ):
        norm = convert(nn.BatchNorm2d(3, **options), dist.group.WORLD).train(training)
        x = torch.randn(2 + rank, 3, 2, 2, requires_grad=True)
        before = dict(collectives.calls)
        norm(x).sum().backward()
        counts[label] = collectives.since(before)
    return counts


def conversions() -> dict[str, Any]:
    """What with_sync_batchnorm makes of a block in a group of several ranks: on CPU, on a GPU, with the knob."""
    block = nn.Sequential(
        nn.Conv2d(3, 3, 3, groups=3), nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 4, 1), nn.BatchNorm1d(4)
    )
    cpu = with_sync_batchnorm(block, dist.group.WORLD, torch.device("cpu"))
    gpu = with_sync_batchnorm(block, dist.group.WORLD, torch.device("cuda", 0))  # builds modules only: no GPU needed
    os.environ[LOCAL_BATCHNORM_ENV] = "1"
    knob = with_sync_batchnorm(block, dist.group.WORLD, torch.device("cpu"))
    del os.environ[LOCAL_BATCHNORM_ENV]
    state = block.state_dict()
    return {
        "cpu": [type(m).__name__ for m in cpu],
        "gpu": [type(m).__name__ for m in gpu],
        "original": [type(m).__name__ for m in block],
        "same_state": all(
            converted.state_dict().keys() == state.keys()
            and all(torch.equal(v, converted.state_dict()[k]) for k, v in state.items())
            for converted in (cpu, gpu)
        ),
        "knob_keeps_the_module": knob is block,
    }


def worker(rank: int, world: int, store: str, out: str) -> None:
    """One rank: every case of this world size on its shard, saved to out/rank-<rank>.pt."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    collectives = Collectives()
    results: dict[str, Any] = {}
    for case in (c for c in CASES if c.world == world):
        start = sum(case.rows[:rank])
        rows, share = slice(start, start + case.rows[rank]), case.rows[rank] / sum(case.rows)
        norm = convert(case.kind(case.shape[0], **case.options), dist.group.WORLD)
        results[case.name] = exercise(norm, case, rows, share, torch.float32)
    results["communication"] = communication(collectives, rank)
    results["conversions"] = conversions()
    torch.save(results, Path(out) / f"rank-{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """Per world size (2, 3): what each rank computed."""
    results = {}
    for world in (2, 3):
        folder = tmp_path_factory.mktemp(f"world-{world}")
        mp.spawn(worker, args=(world, str(folder / "store"), str(folder)), nprocs=world)
        results[world] = [torch.load(folder / f"rank-{r}.pt", weights_only=False) for r in range(world)]
    return results


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, scale: float = 0.0) -> None:
    """Equal to TOLERANCE times the larger of `scale` and expected's largest magnitude (and relatively)."""
    expected = expected.to(actual.dtype)
    scale = max(scale, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=TOLERANCE, atol=TOLERANCE * scale, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shards_train_and_evaluate_like_one_batchnorm_on_the_whole_batch(
    case: Case, ranks: dict[int, list[dict[str, Any]]]
) -> None:
    shards = [results[case.name] for results in ranks[case.world]]
    # float32 nn.BatchNorm rounds x * (invstd * w) + (b - mean * invstd * w): ~6e-4 off at a mean of 1e4
    expected = oracle(case, torch.float64 if "large-mean" in case.name else torch.float32)
    for key in ("output", "grad_input", "eval_output"):
        assert_close(torch.cat([shard[key] for shard in shards]), expected[key], key)
    for key in ("grad_weight", "grad_bias"):  # the runtime all-reduces (sums) each shard's share-weighted gradient
        assert (key in expected) == (key in shards[0])
        if key in expected:
            partials = torch.stack([shard[key] for shard in shards])
            # shards with different means have partial sums of opposite signs, several times the total: a sum of
            # float32 partials is exact to their scale, not the total's
            assert_close(partials.sum(0), expected[key], key, scale=float(partials.abs().max()))
    buffers = {key for key in expected if key.startswith(("running", "num_batches"))}
    assert buffers == {key for key in shards[0] if key.startswith(("running", "num_batches"))}
    assert bool(buffers) == case.options.get("track_running_stats", True)
    for key in buffers:
        assert all(torch.equal(shard[key], shards[0][key]) for shard in shards), f"{key} differs between ranks"
        assert_close(shards[0][key], expected[key], key)


def test_the_cases_would_catch_a_combination_that_ignores_shard_sizes() -> None:
    case = CASES[0]  # shards of 7 and 8 rows with means near 3 and -2
    x, _ = batch(case, 0)
    parts = torch.stack([shard_moments(x[:7].clone()).moments, shard_moments(x[7:].clone()).moments])
    count, mean, m2 = combine_moments(parts)
    true_var, true_mean = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
    assert count == 15 * 16
    assert_close(mean, true_mean, "mean")
    assert_close(m2 / count, true_var, "variance")
    equal_weights = parts.clone()
    equal_weights[:, 0] = 1.0  # as if the shards had the same size
    _, wrong_mean, _ = combine_moments(equal_weights)
    with pytest.raises(AssertionError, match="mean"):
        assert_close(wrong_mean, true_mean, "mean")


def test_a_large_mean_keeps_its_variance_where_sums_of_squares_would_not() -> None:
    case = next(c for c in CASES if c.name == "2d-large-mean")
    x, _ = batch(case, 0)
    dims, count = (0, 2, 3), x.numel() // x.size(1)
    true_var, _ = torch.var_mean(x.double(), dim=dims, correction=0)
    parts = torch.stack([shard_moments(x[:7].clone()).moments, shard_moments(x[7:].clone()).moments])
    _, _, m2 = combine_moments(parts)
    assert_close(m2 / count, true_var, "variance")
    naive = (x * x).sum(dims) / count - (x.sum(dims) / count) ** 2  # E[x^2] - E[x]^2 in float32
    with pytest.raises(AssertionError, match="variance"):
        torch.testing.assert_close(naive.double(), true_var, rtol=1e-5, atol=0, msg=lambda m: f"variance: {m}")


def test_each_training_step_communicates_once_forward_and_once_backward_and_eval_never(
    ranks: dict[int, list[dict[str, Any]]],
) -> None:
    for world in (2, 3):
        for results in ranks[world]:
            assert results["communication"] == {
                "train": {"all_gather": 1, "all_reduce": 1},
                "eval": {"all_gather": 0, "all_reduce": 0},
                "eval-no-running-stats": {"all_gather": 1, "all_reduce": 1},  # batch statistics, as nn.BatchNorm
            }


def test_split_rows_train_a_converted_copy(ranks: dict[int, list[dict[str, Any]]]) -> None:
    conversions = ranks[2][0]["conversions"]
    assert conversions["cpu"] == ["Conv2d", "CrossRankBatchNorm", "ReLU", "Conv2d", "CrossRankBatchNorm"]
    assert conversions["gpu"] == ["Conv2d", "SyncBatchNorm", "ReLU", "Conv2d", "SyncBatchNorm"]
    assert conversions["original"] == ["Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "BatchNorm1d"]  # left as it was
    assert conversions["same_state"] and conversions["knob_keeps_the_module"]


@pytest.fixture
def single_process_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_conversion_keeps_parameters_buffers_and_keys(single_process_group: None) -> None:
    block = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, momentum=None), nn.Sequential(nn.BatchNorm1d(4)))
    block[1].running_mean.fill_(2.0)
    keys, weight, running_mean = set(block.state_dict()), block[1].weight, block[1].running_mean
    block.eval()
    converted = convert(block, dist.group.WORLD)
    assert isinstance(converted[1], CrossRankBatchNorm) and isinstance(converted[2][0], CrossRankBatchNorm)
    assert set(converted.state_dict()) == keys
    assert converted[1].weight is weight and converted[1].running_mean is running_mean
    assert converted[1].momentum is None and not converted[1].training
    assert isinstance(convert(nn.BatchNorm2d(2), dist.group.WORLD), CrossRankBatchNorm)


def test_a_single_value_per_channel_and_a_wrong_rank_are_refused(single_process_group: None) -> None:
    norm = convert(nn.BatchNorm1d(3), dist.group.WORLD)
    with pytest.raises(ValueError, match=r"has 1 value per channel .* training needs more than one"):
        norm(torch.randn(1, 3))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input, got 4D"):
        norm(torch.randn(2, 3, 1, 1))
