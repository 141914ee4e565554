"""Re-cutting finetune checkpoints for another plan (pipebd_core/finetune/recut.py): DDP's one unit of the
whole network into pipeline stages and back, weights, buffers and SGD momentum kept. Tier: pure logic on a
4-layer network in memory (no processes)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipebd_core.finetune.recut import recut_checkpoints
from pipebd_core.rank import checkpoint
from pipebd_core.rank.network import Network
from pipebd_core.rundir import CheckpointFolder


def stage_with_optimizer(network: Network, start: int, stop: int) -> tuple[nn.Module, torch.optim.SGD]:
    """Layers [start, stop) and a fresh SGD with momentum over them, as a finetune rank holds them (a stage
    without a parameter keeps a placeholder)."""
    module = network.sequential(start, stop)
    parameters = list(module.parameters()) or [nn.Parameter(torch.zeros(0))]
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9)
    return module, optimizer


def test_a_ddp_checkpoint_recut_into_stages_and_back_keeps_weights_buffers_and_momentum(tmp_path: Path) -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)]
    network = Network(nn.Sequential(*layers), layers, ["0", "1", "2", "3"])
    whole, optimizer = stage_with_optimizer(network, 0, 4)
    for _ in range(2):
        whole(torch.randn(8, 4)).square().mean().backward()
        optimizer.step()
    saved = {"module": whole.state_dict(), "optimizer": optimizer.state_dict()}
    folder = CheckpointFolder(tmp_path / "finetune")
    checkpoint.save_block(folder, 0, 5, saved)
    checkpoint.save_block(folder, 0, 3, saved)  # an older step: gone after the re-cut

    stages = [(0, 2), (2, 3), (3, 4)]  # the middle stage, a ReLU, has no parameter
    assert recut_checkpoints(folder, network, [(0, 4)], stages) == 5
    assert [folder.saved_steps(unit) for unit in range(3)] == [[5], [5], [5]]
    momentum = {name: optimizer.state[p]["momentum_buffer"] for name, p in whole.named_parameters()}
    for unit, (start, stop) in enumerate(stages):
        module, stage_optimizer = stage_with_optimizer(network, start, stop)
        state = checkpoint.load_block(folder, unit, 5)
        module.load_state_dict(state["module"])
        stage_optimizer.load_state_dict(state["optimizer"])  # refuses a state of another parameter count
        for name, p in module.named_parameters():
            layer, rest = name.split(".", 1)
            expected = momentum[f"{start + int(layer)}.{rest}"]
            torch.testing.assert_close(stage_optimizer.state[p]["momentum_buffer"], expected, rtol=0, atol=0)
    assert int(checkpoint.load_block(folder, 0, 5)["module"]["1.num_batches_tracked"]) == 2  # a buffer kept

    assert recut_checkpoints(folder, network, stages, [(0, 4)]) == 5  # back to DDP's one unit: the same state
    back = checkpoint.load_block(folder, 0, 5)
    assert back["module"].keys() == saved["module"].keys()
    for key, value in saved["module"].items():
        torch.testing.assert_close(back["module"][key], value, rtol=0, atol=0)
    restored, restored_optimizer = stage_with_optimizer(network, 0, 4)
    restored_optimizer.load_state_dict(back["optimizer"])
    for name, p in restored.named_parameters():
        torch.testing.assert_close(restored_optimizer.state[p]["momentum_buffer"], momentum[name], rtol=0, atol=0)
