"""The bundled VGG-16 example runs through the `pipebd` CLI and assembles the compressed network.

Every mode runs at 1, 2, 3 and 5 ranks in test_equivalence.py; `scripts/smoke_modes.sh` runs the
bundled examples in every mode at 1, 2 and 4 ranks (minutes, so outside the test suite).

Tier: `pipebd run` as a subprocess with gloo ranks through torchrun.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from tests.helpers import ROOT, pipebd


def test_vgg16_example_runs_and_assembles_the_compressed_network(tmp_path: Path) -> None:
    """In dp, so every student BatchNorm is the cross-rank one while it trains, and the compressed network
    assembled afterwards must hold plain BatchNorm2d (a module holding a process group cannot be saved)."""
    run = tmp_path / "run"
    example = ROOT / "examples" / "vgg16-dsconv.yaml"
    overrides = ["--set", "train.max_steps=2", "--set", "schedule.profile=false", "--mode", "dp"]
    overrides += ["--set", "data.batch_size=8", "--set", "data.num_samples=32"]  # 4 rows a rank: enough for a step
    result = pipebd("run", str(example), "--out", str(run), *overrides, timeout=300)
    assert result.returncode == 0, result.stderr
    students = torch.load(run / "student.pt", weights_only=True)
    assert {key.split(".")[1] for key in students} == {str(i) for i in range(13)}
    compressed = torch.load(run / "compressed_model.pt", weights_only=False)
    assert compressed(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert {type(m).__name__ for m in compressed.modules() if isinstance(m, _BatchNorm)} == {"BatchNorm2d"}
    assert "samples/s" in result.stderr
    assert "pipebd: warning: the vgg16 teacher is randomly initialised" in result.stderr
