"""Splitting a stage's backward into its input gradient (I) and its weight gradient (W), as 2BP does.

`defer_weight_gradients(module)` makes every Conv2d and Linear inside `module` compute, in the backward
autograd runs, only the gradient of its input, and keep (its input, its output's gradient) aside. The
returned `WeightGradients` computes the weight and bias gradients of everything kept, when asked, in
one batched call per layer over all the micro-batches kept since (the 2BP code's batched
backward-p2): dW = dY^T X for Linear, `conv2d_weight` over the concatenated batch for Conv2d. Other
parameters (BatchNorm's) get their gradients in the input pass, as autograd gives them.

The parameters stay the modules' own (their state_dict and optimiser are unchanged); only `forward`
changes, and `restore` undoes it. `input_gradient` and `weight_gradients` are the two halves of a layer's
backward as formulas; moved.py computes a channel slice of the first on another stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_input, conv2d_weight


@dataclass
class Switch:
    """Whether input passes keep what their weight gradient needs (off: a pass that trains nothing, such as
    a pipeline stage's shape inference, which runs the backward once on dummy tensors)."""

    on: bool = True


@dataclass
class Kept:
    """What one layer's input passes kept for its weight gradient: inputs and output gradients."""

    switch: Switch
    inputs: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)

    def keep(self, x: torch.Tensor, grad: torch.Tensor) -> None:
        if self.switch.on:
            self.inputs.append(x.detach())
            self.grads.append(grad.detach())


def input_gradient(layer: nn.Module, weight: torch.Tensor, grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """dL/dx of a Linear or Conv2d `layer` computed with `weight` (the layer's, or a slice of its input
    channels) from the output gradient `grad`; `shape` is the shape of that input (or of its slice)."""
    if isinstance(layer, nn.Linear):
        return grad @ weight
    assert isinstance(layer, nn.Conv2d)
    return conv2d_input(shape, weight, grad, layer.stride, layer.padding, layer.dilation, layer.groups)


def weight_gradients(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dL/dW, dL/db) of a Linear or Conv2d `layer` from its inputs and their output gradients (any batch)."""
    bias = None
    if isinstance(layer, nn.Linear):
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        if layer.bias is not None:
            bias = dy2.sum(0)
        return dy2.t() @ x2, bias
    assert isinstance(layer, nn.Conv2d)
    weight = conv2d_weight(x, layer.weight.shape, dy, layer.stride, layer.padding, layer.dilation, layer.groups)
    if layer.bias is not None:
        bias = dy.sum((0, 2, 3))
    return weight, bias


class _LinearInput(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, linear: nn.Linear, kept: Kept
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.linear, ctx.kept = linear, kept
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        x, weight = ctx.saved_tensors
        ctx.kept.keep(x, grad)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        return input_gradient(ctx.linear, weight, grad, x.shape), None, None, None, None


class _ConvInput(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: nn.Conv2d, kept: Kept
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.conv, ctx.kept = conv, kept
        return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        x, weight = ctx.saved_tensors
        conv: nn.Conv2d = ctx.conv
        ctx.kept.keep(x, grad)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        return input_gradient(conv, weight, grad, x.shape), None, None, None, None


def _accumulate(param: torch.Tensor | None, value: torch.Tensor) -> None:
    if param is None:
        return
    param.grad = value if param.grad is None else param.grad.add_(value)


class WeightGradients:
    """The deferred W of a module's Conv2d and Linear layers; `run()` computes everything kept, batched."""

    def __init__(self, layers: dict[nn.Module, Kept], switch: Switch) -> None:
        self.layers, self.switch = layers, switch
        self.calls = 0  # W computations that found something kept (for the tests and telemetry)

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        """Input passes inside the block keep their weight gradient's inputs, whatever the switch was."""
        was, self.switch.on = self.switch.on, True
        try:
            yield
        finally:
            self.switch.on = was

    def pending(self) -> int:
        """Micro-batches kept and not yet turned into weight gradients (per layer, the most)."""
        return max((len(kept.inputs) for kept in self.layers.values()), default=0)

    def run(self) -> None:
        if not self.pending():
            return
        self.calls += 1
        with torch.no_grad():
            for layer, kept in self.layers.items():
                if not kept.inputs:
                    continue
                x, dy = torch.cat(kept.inputs), torch.cat(kept.grads)
                kept.inputs.clear()
                kept.grads.clear()
                assert isinstance(layer, nn.Linear | nn.Conv2d)
                weight, bias = weight_gradients(layer, x, dy)
                _accumulate(layer.weight, weight)
                if bias is not None:
                    _accumulate(layer.bias, bias)

    def restore(self) -> None:
        """Give every layer its own forward back."""
        for layer in self.layers:
            layer.__dict__.pop("forward", None)


def _deferred_forward(layer: nn.Module, kept: Kept) -> Any:
    if isinstance(layer, nn.Linear):
        return lambda x: _LinearInput.apply(x, layer.weight, layer.bias, layer, kept)
    assert isinstance(layer, nn.Conv2d)
    if layer.padding_mode != "zeros":
        raise ValueError(f"{layer}: only zero-padded convolutions can defer their weight gradient")
    return lambda x: _ConvInput.apply(x, layer.weight, layer.bias, layer, kept)


def defer_weight_gradients(module: nn.Module) -> WeightGradients:
    """Make `module`'s Conv2d and Linear layers keep their weight gradient for later (see the docstring)."""
    switch, layers = Switch(), dict[nn.Module, Kept]()
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv2d) and layer.weight.requires_grad:
            layers[layer] = Kept(switch)
            layer.forward = _deferred_forward(layer, layers[layer])  # type: ignore[method-assign]
    return WeightGradients(layers, switch)
