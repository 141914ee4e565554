"""What a trained network is judged by: top-1 accuracy of a classifier and perplexity of a language model
on the spec's held-out data."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from pipebd_core.data.batches import iterate_eval_batches
from pipebd_core.data.datasets import build_dataset
from pipebd_core.spec import Spec

EVAL_BATCH = 64


def eval_outputs(model: nn.Module, spec: Spec, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(the model's outputs, labels) in order over the first `data.eval_samples` samples of the eval split."""
    dataset = build_dataset(spec, split="eval")
    model.to(device).eval()
    with torch.no_grad():
        for inputs, labels in iterate_eval_batches(spec, dataset, EVAL_BATCH):
            yield model(inputs.to(device)).cpu(), labels


def top1_accuracy(model: nn.Module, spec: Spec, device: torch.device) -> float | None:
    """Top-1 accuracy on the eval split, or None when the data set has no labels."""
    if spec.data.eval_samples == 0:
        return None
    correct = seen = 0
    for outputs, labels in eval_outputs(model, spec, device):
        if int(labels.min()) < 0:
            return None
        correct += int((outputs.argmax(dim=1) == labels).sum())
        seen += len(labels)
        if seen >= spec.data.eval_samples:
            break
    return correct / seen if seen else None


def perplexity(model: nn.Module, spec: Spec, device: torch.device) -> float | None:
    """exp of the mean next-token cross-entropy over the first `data.eval_samples` held-out sequences."""
    if spec.data.eval_samples == 0:
        return None
    total, tokens = 0.0, 0
    for logits, labels in eval_outputs(model, spec, device):
        total += float(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum"))
        tokens += labels.numel()
    return math.exp(total / tokens) if tokens else None
