"""A finetune resumed under another cut: its stage checkpoints rewritten for the new plan's stages.

The finetune phase checkpoints one unit per stage (checkpoints/finetune/block-<stage>/step-<s>.pt: the stage's
layers as `network.sequential(start, stop)` names them, and its SGD state by parameter position; DDP's one unit
is the whole network). When the plan_finetune phase plans again for another rank count (an elastic job resumed
on the nodes it has, docs/multinode.md) its strategy and cut may change; `recut_checkpoints` then takes every
stage's checkpoint at the step they all saved, splits it into layers (weights, buffers and momentum) and
writes the new stages' units at that step, so the ranks resume from it under the new plan. What is learned
does not depend on the cut: the weights and momentum are the same numbers, only who holds them changes.
"""

from __future__ import annotations

import shutil
from typing import Any

import torch

from pipebd_core.rank import checkpoint
from pipebd_core.rank.network import Network
from pipebd_core.rundir import CheckpointFolder

Stages = list[tuple[int, int]]
LayerState = dict[str, Any]  # one layer's tensors, by name within the layer: weights, buffers, momentum


def recut_checkpoints(folder: CheckpointFolder, network: Network, old: Stages, new: Stages) -> int:
    """Rewrite the checkpoints of stages `old` as those of stages `new` at the newest step every old stage
    saved; that step (0: nothing to resume from, and any partial checkpoints are dropped)."""
    step = folder.resume_steps(len(old), common=True)[0]
    if step == 0:
        shutil.rmtree(folder.root, ignore_errors=True)
        return 0
    states = [checkpoint.load_block(folder, unit, step) for unit in range(len(old))]
    modules, momentum, groups = split_layers(network, old, states)
    staged = CheckpointFolder(folder.root.with_name(folder.root.name + ".recut"))
    shutil.rmtree(staged.root, ignore_errors=True)
    for unit, (start, stop) in enumerate(new):
        state = join_layers(network, start, stop, modules, momentum, groups)
        checkpoint.save_block(staged, unit, step, state)
    replaced = folder.root.with_name(folder.root.name + ".old")
    folder.root.rename(replaced)
    staged.root.rename(folder.root)
    shutil.rmtree(replaced, ignore_errors=True)
    return step


def split_layers(
    network: Network, stages: Stages, states: list[dict[str, Any]]
) -> tuple[dict[int, LayerState], dict[int, LayerState], list[dict[str, Any]]]:
    """(each layer's module state, each layer's momentum buffers, the first stage's optimiser settings)."""
    modules: dict[int, LayerState] = {index: {} for index in range(network.num_layers)}
    momentum: dict[int, LayerState] = {index: {} for index in range(network.num_layers)}
    for (start, stop), state in zip(stages, states, strict=True):
        for key, value in state["module"].items():
            position, name = key.split(".", 1)
            modules[start + int(position)][name] = value
        saved = state["optimizer"]["state"]
        for index, key in enumerate(parameter_names(network, start, stop)):
            position, name = key.split(".", 1)
            if index in saved and "momentum_buffer" in saved[index]:
                momentum[start + int(position)][name] = saved[index]["momentum_buffer"]
    return modules, momentum, states[0]["optimizer"]["param_groups"]


def join_layers(
    network: Network,
    start: int,
    stop: int,
    modules: dict[int, LayerState],
    momentum: dict[int, LayerState],
    groups: list[dict[str, Any]],
) -> dict[str, Any]:
    """The checkpoint of a stage of layers [start, stop): its module state and SGD state, as a rank of it saves
    them (a stage without parameters keeps one empty placeholder parameter, without momentum)."""
    module = {
        f"{index - start}.{name}": value for index in range(start, stop) for name, value in modules[index].items()
    }
    names = parameter_names(network, start, stop)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for position, key in enumerate(names):
        layer, name = key.split(".", 1)
        buffer = momentum[start + int(layer)].get(name)
        if buffer is not None:
            state[position] = {"momentum_buffer": buffer}
    settings = {name: value for name, value in groups[0].items() if name != "params"}
    optimizer = {"state": state, "param_groups": [{**settings, "params": list(range(max(1, len(names))))}]}
    return {"module": module, "optimizer": optimizer}


def parameter_names(network: Network, start: int, stop: int) -> list[str]:
    """The parameters of layers [start, stop) in the order a stage's optimiser holds them."""
    return [name for name, _ in network.sequential(start, stop).named_parameters()]
