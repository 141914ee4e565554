"""ProxylessNAS-style supernet blocks: each searchable layer mixes MBConv candidates.

Candidates are MBConv with kernel 3, 5 or 7 and expansion 3 or 6, plus `zero` (skip the layer)
where the layer keeps its stride at 1 and its width. Each mixed layer has one architecture
parameter per candidate. With binary gates (the default) the weight round runs one sampled path
and the architecture round runs two sampled candidates behind binary gates whose gradient is
ProxylessNAS's estimate; with softmax gates every candidate runs, weighted by softmax(alpha).
Sampling draws from a generator the runtime seeds per (block, step, round), so every rank that
holds a block samples the same paths whatever the mode or the number of ranks.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from pipebd_core.workloads.loading import init_default
from pipebd_core.workloads.search_space import CANDIDATES, ZERO, candidate_name


def norm_layer(channels: int, norm: bool) -> nn.Module:
    return nn.BatchNorm2d(channels) if norm else nn.Identity()


class MBConv(nn.Sequential):
    """Inverted residual body: 1x1 expand, k x k depthwise (with the stride), 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, kernel: int, expansion: int, norm: bool) -> None:
        hidden = cin * expansion
        super().__init__(
            nn.Conv2d(cin, hidden, 1, bias=not norm),
            norm_layer(hidden, norm),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=not norm),
            norm_layer(hidden, norm),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=not norm),
            norm_layer(cout, norm),
        )


class BinaryGates(torch.autograd.Function):
    """One-hot gates forward; ProxylessNAS's estimate dL/dalpha_i = sum_j dL/dg_j p_j (delta_ij - p_i) back."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, active: int) -> torch.Tensor:
        probabilities = torch.softmax(logits, dim=0)
        ctx.save_for_backward(probabilities)
        gates = torch.zeros_like(logits)
        gates[active] = 1.0
        return gates

    @staticmethod
    def backward(ctx: Any, grad_gates: torch.Tensor) -> tuple[torch.Tensor, None]:
        (p,) = ctx.saved_tensors
        return p * grad_gates - p * (p * grad_gates).sum(), None


class MixedLayer(nn.Module):
    """One searchable layer: candidates, their architecture parameters, and the sampled path."""

    def __init__(self, cin: int, cout: int, stride: int, norm: bool, gates: str) -> None:
        super().__init__()
        self.residual = stride == 1 and cin == cout
        self.ops = nn.ModuleList(MBConv(cin, cout, stride, k, e, norm) for k, e in CANDIDATES)
        self.names = [candidate_name(k, e) for k, e in CANDIDATES] + ([ZERO] if self.residual else [])
        self.alpha = nn.Parameter(torch.zeros(len(self.names)))
        self.gates = gates
        self.round = "weights"
        self.active: tuple[int, ...] = (0,)  # weights: the path; arch: the two candidates
        self.chosen = 0  # arch: index into `active` of the open gate

    def probabilities(self) -> torch.Tensor:
        return torch.softmax(self.alpha.detach().float().cpu(), dim=0)

    def sample(self, round_: str, generator: torch.Generator) -> None:
        """Draw this step's path(s) from `generator` (nothing to draw with softmax gates)."""
        self.round = round_
        if self.gates == "softmax":
            return
        p = self.probabilities()
        if round_ == "weights":
            self.active = (int(torch.multinomial(p, 1, generator=generator)),)
            return
        pair = torch.multinomial(p, 2, replacement=False, generator=generator).tolist()
        self.active = (int(pair[0]), int(pair[1]))
        self.chosen = int(torch.multinomial(p[pair] / p[pair].sum(), 1, generator=generator))

    def sampled(self) -> list[int]:
        """This step's draw as candidate indices: the path (weights), or the pair then the open gate's
        position in it (arch); empty with softmax gates, which draw nothing."""
        if self.gates == "softmax":
            return []
        return list(self.active) if self.round == "weights" else [*self.active, self.chosen]

    def _op(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.names[index] == ZERO else self.ops[index](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x if self.residual else None
        if self.gates == "softmax":
            weights = torch.softmax(self.alpha, dim=0)
            terms = [w * y for i, w in enumerate(weights) if (y := self._op(i, x)) is not None]
        elif self.round == "weights":
            y = self._op(self.active[0], x)
            terms = [] if y is None else [y]
        else:
            gates = BinaryGates.apply(self.alpha[list(self.active)], self.chosen)
            terms = [g * y for g, i in zip(gates, self.active, strict=True) if (y := self._op(i, x)) is not None]
        total = sum(terms[1:], terms[0]) if terms else torch.zeros_like(x)
        return total if out is None else out + total

    def derive(self) -> tuple[str, nn.Module]:
        """The most probable candidate, as a standalone layer."""
        best = int(self.probabilities().argmax())
        if self.names[best] == ZERO:
            return ZERO, nn.Identity()
        return self.names[best], DerivedLayer(copy.deepcopy(self.ops[best]), self.residual)


class DerivedLayer(nn.Module):
    def __init__(self, body: nn.Module, residual: bool) -> None:
        super().__init__()
        self.body, self.residual = body, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class SupernetBlock(nn.Module):
    """Fixed prefix (the stem, for block 0), searchable layers, fixed suffix (the head, for the last block)."""

    def __init__(self, prefix: list[nn.Module], layers: list[MixedLayer], suffix: list[nn.Module]) -> None:
        super().__init__()
        self.prefix = nn.Sequential(*prefix)
        self.layers = nn.ModuleList(layers)
        self.suffix = nn.Sequential(*suffix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prefix(x)
        for layer in self.layers:
            x = layer(x)
        return self.suffix(x)

    def mixed_layers(self) -> list[MixedLayer]:
        return [cast(MixedLayer, layer) for layer in self.layers]

    def arch_parameters(self) -> list[nn.Parameter]:
        return [layer.alpha for layer in self.mixed_layers()]

    def weight_parameters(self) -> Iterator[nn.Parameter]:
        arch = {id(p) for p in self.arch_parameters()}
        return (p for p in self.parameters() if id(p) not in arch)

    def begin_round(self, round_: str, generator: torch.Generator) -> None:
        """Sample this step's paths; the arch round trains only alpha, the weight round only weights."""
        for layer in self.mixed_layers():
            layer.sample(round_, generator)
        for param in self.weight_parameters():
            param.requires_grad_(round_ == "weights")

    def probabilities(self) -> list[list[float]]:
        return [layer.probabilities().tolist() for layer in self.mixed_layers()]

    def sampled(self) -> list[list[int]]:
        """Every searchable layer's draw for the current step (see MixedLayer.sampled)."""
        return [layer.sampled() for layer in self.mixed_layers()]

    def derive(self) -> tuple[list[str], nn.Sequential]:
        """(chosen candidate per layer, the searched block as a standalone module)."""
        choices = [layer.derive() for layer in self.mixed_layers()]
        modules = [copy.deepcopy(self.prefix), *(module for _, module in choices), copy.deepcopy(self.suffix)]
        return [name for name, _ in choices], nn.Sequential(*modules)


def init_supernet(module: nn.Module, generator: torch.Generator) -> None:
    """Default initialisation drawn from `generator`, and uniform architecture parameters (zeros)."""
    init_default(module, generator)
    for m in module.modules():
        if isinstance(m, MixedLayer):
            nn.init.zeros_(m.alpha)


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the student's prediction against the teacher's softmax, mean over the batch."""
    return -(torch.softmax(teacher_logits, dim=1) * F.log_softmax(student_logits, dim=1)).sum(dim=1).mean()
