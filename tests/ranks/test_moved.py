"""LayerPipe's moved delta share: trained weights equal full-batch training with Conv2d and Linear boundary
layers, shares 0, a fraction and the whole layer, on 2 and 3 gloo ranks; bad partitions refused before
launch.

Tier: multi-rank runs of a kind `train` job on scikit-learn's digits (through the supervisor, shared
with `finished_run`) against the full-batch loop of test_finetune.py, whose weights every unmoved
partition of every strategy meets to 1e-5 there; refusals through the preflight.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from torch import nn

from pipebd_core.documents.phases import FINETUNE
from pipebd_core.job.steps import preflight
from pipebd_core.rundir import RunDir
from pipebd_core.spec import SpecError, parse_spec
from tests.helpers import assert_same_weights, checkpointed_finetune
from tests.ranks.test_finetune import e2e_document, full_batch_training

FACTORY = "tests.ranks.test_moved:make_network"


def make_network(classes: int = 10) -> nn.Module:
    """Conv2d boundaries at layers 2 (8 -> 8 channels) and 4 (8 -> 6, stride 2), Linear ones at 8 (24 -> 16)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 6, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(1),
        nn.Linear(24, 16),
        nn.ReLU(),
        nn.Linear(16, classes),
    )


def moved_document(strategy: str, nproc: int, stages: list[int], moved: list[float]) -> dict[str, Any]:
    document = e2e_document(strategy, nproc, stages=stages, moved=moved)
    document["workload"]["factory"] = FACTORY
    return document


# (strategy, ranks, stage starts, shares): every boundary's last layer, channels and share, once each
CASES = [
    ("zb", 2, [0, 5], [0.5]),  # Conv2d 8 -> 6: 4 of its 8 input channels' delta on stage 1
    ("1f1b", 3, [0, 3, 9], [1.0, 0.25]),  # Conv2d 8 -> 8 whole; Linear 24 -> 16: 6 of 24 features
    ("zb", 3, [0, 5, 9], [0.0, 1.0]),  # Conv2d: nothing moved; Linear whole
]


@pytest.mark.parametrize(("strategy", "nproc", "stages", "moved"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_moved_delta_share_trains_what_full_batch_training_trains(
    strategy: str, nproc: int, stages: list[int], moved: list[float], finished_run: Callable[..., RunDir]
) -> None:
    spec = parse_spec(moved_document(strategy, nproc, stages, moved))
    run_dir = finished_run(spec, until=FINETUNE)  # its weights from the finetune phase's last checkpoints
    assert_same_weights(checkpointed_finetune(run_dir), full_batch_training(spec))
    plan = run_dir.read_json(run_dir.finetune_plan)
    widths = [getattr(layer, "in_channels", getattr(layer, "in_features", 0)) for layer in make_network().children()]
    channels = [round(share * widths[start - 1]) for share, start in zip(moved, stages[1:], strict=True)]
    assert plan["moved"] == channels
    steps, microbatches = 3, 4
    for boundary, count in enumerate(channels):  # the share ran where the plan put it, every micro-batch
        owner, taker = lines(run_dir, boundary), lines(run_dir, boundary + 1)
        assert [line["moved_combined"] for line in owner][-1] == (steps * microbatches if count else 0)
        assert [line["moved_computed"] for line in taker][-1] == (steps * microbatches if count else 0)


def lines(run_dir: RunDir, rank: int) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in run_dir.metrics(rank, "finetune").read_text().splitlines()]
    return [record for record in records if "elapsed" in record]


def test_the_plan_says_what_moves_and_what_it_adds_to_a_step(finished_run: Callable[..., RunDir]) -> None:
    strategy, nproc, stages, moved = CASES[0]
    run_dir = finished_run(parse_spec(moved_document(strategy, nproc, stages, moved)), until=FINETUNE)  # the run above
    partition = run_dir.read_json(run_dir.finetune_plan)["partition"]
    (move,) = partition["moves"]
    conv = list(make_network().children())[4]
    assert isinstance(conv, nn.Conv2d) and (move["layer"], move["channels"], move["of"]) == (4, 4, 8)
    microbatch, count, entering = 12 // 4, 4, [8, 8, 8]  # 8x8 digits, 8 channels into layer 4
    assert move["weight_bytes_per_step"] == conv.weight.numel() * 4 // 2
    assert move["grad_bytes_per_step"] == count * microbatch * math.prod(entering) * 4 // 2
    assert partition["extra_bytes_per_step"] == move["weight_bytes_per_step"] + move["grad_bytes_per_step"]
    assert partition["partitioner"] == "given" and len(partition["stage_work_s"]) == 2


@pytest.mark.parametrize(
    ("finetune", "message"),
    [
        ({"partitioner": "metis"}, "finetune.partitioner: Input should be 'even', 'pipedream', 'layerpipe' or 'auto'"),
        (
            {"partitioner": "layerpipe", "profile": True, "stages": [0, 5]},
            "finetune.stages: partitioner 'layerpipe' cuts the stages itself and plans the moved shares; remove",
        ),
        ({"partitioner": "layerpipe"}, "finetune.profile: partitioner 'layerpipe' plans from measured"),
        ({"moved": [0.5]}, "finetune.moved: the shares belong to explicit stage cuts; give finetune.stages too"),
        ({"stages": [0, 5], "moved": [0.5, 0.5]}, "finetune.moved: 2 shares for 2 stages; give one per boundary (1)"),
        (
            {"stages": [0, 6], "moved": [0.5]},  # layer 5 is a ReLU
            "finetune.moved: share 0.5 at boundary 0 (stage 0 -> 1) would split the delta of layer 5 (5, ReLU),"
            " which cannot be split by channels (only a Linear, or a Conv2d with groups 1 and zero padding can);"
            " set it to 0, or end stage 0 with layer 2 (2, Conv2d) or layer 4 (4, Conv2d): stage 1 starting at 3"
            " or 5 in finetune.stages",
        ),
    ],
)
def test_bad_partitions_are_refused_before_launch(finetune: dict[str, Any], message: str) -> None:
    document = moved_document("gpipe", 2, [0, 5], [0.0])
    document["finetune"].pop("stages")
    document["finetune"].pop("moved")
    document["finetune"].update(finetune)
    with pytest.raises(SpecError, match=re.escape(message)):
        preflight(parse_spec(document))
