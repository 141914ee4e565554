"""tier: pure logic, CPU

The finetune phase's kd loss (pipebd_core/finetune/rank.py): alpha x CE + (1 - alpha) x T^2 x a divergence
of the softened teacher and student distributions, `finetune.divergence` forward KL, reverse KL or the
Jensen-Shannon mixture, each against its definition written out.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipebd_core.finetune.rank import make_loss
from pipebd_core.spec import Spec, SpecError, load_spec
from tests.helpers import ROOT

ALPHA, TEMPERATURE = 0.3, 2.0


def digits_spec(**finetune: object) -> Spec:
    """The digits example (a VGG teacher and its compressed student), with these finetune fields."""
    return load_spec(ROOT / "examples" / "digits-compress.yaml", [f"finetune.{k}={v}" for k, v in finetune.items()])


def rows(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    student, teacher = torch.randn(6, 5, generator=generator), 2 * torch.randn(6, 5, generator=generator)
    return student, teacher, torch.randint(0, 5, (6,), generator=generator)


def written_out(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, divergence: str) -> torch.Tensor:
    p, q = (teacher / TEMPERATURE).softmax(1), (student / TEMPERATURE).softmax(1)
    m = (p + q) / 2
    per_row = {
        "forward": (p * (p / q).log()).sum(1),
        "reverse": (q * (q / p).log()).sum(1),
        "jsd": 0.5 * (p * (p / m).log()).sum(1) + 0.5 * (q * (q / m).log()).sum(1),
    }[divergence]
    return ALPHA * F.cross_entropy(student, labels) + (1 - ALPHA) * TEMPERATURE**2 * per_row.mean()


@pytest.mark.parametrize("divergence", ["forward", "reverse", "jsd"])
@pytest.mark.parametrize("seed", [0, 1])
def test_each_divergence_is_its_definition(divergence: str, seed: int) -> None:
    loss = make_loss(digits_spec(loss="kd", alpha=ALPHA, temperature=TEMPERATURE, divergence=divergence))
    student, teacher, labels = rows(seed)
    target = torch.cat([teacher, labels.unsqueeze(1).float()], dim=1)  # as teacher_target packs it
    torch.testing.assert_close(loss(student, target), written_out(student, teacher, labels, divergence))


def test_a_language_models_kd_is_the_mean_over_its_tokens() -> None:
    """Logits (batch, sequence, vocabulary) with a label per token: every token is a row of the definition."""
    loss = make_loss(digits_spec(loss="kd", alpha=ALPHA, temperature=TEMPERATURE, divergence="forward"))
    student, teacher, labels = rows(4)  # 6 rows of 5 classes: 2 sequences of 3 tokens
    target = torch.cat([teacher, labels.unsqueeze(1).float()], dim=1).view(2, 3, 6)
    expected = written_out(student, teacher, labels, "forward")
    torch.testing.assert_close(loss(student.view(2, 3, 5), target), expected)
    cross_entropy = make_loss(digits_spec(loss="ce"))
    per_token = cross_entropy(student.view(2, 3, 5), labels.view(2, 3))
    torch.testing.assert_close(per_token, F.cross_entropy(student, labels))


def test_the_divergences_differ_and_the_mixture_is_symmetric_and_bounded() -> None:
    student, teacher, labels = rows(3)
    values = {name: written_out(student, teacher, labels, name) for name in ("forward", "reverse", "jsd")}
    assert len({round(float(value), 6) for value in values.values()}) == 3
    swapped = written_out(teacher, student, labels, "jsd") - ALPHA * F.cross_entropy(teacher, labels)
    same = values["jsd"] - ALPHA * F.cross_entropy(student, labels)
    torch.testing.assert_close(swapped, same)
    assert 0 < float(same) <= (1 - ALPHA) * TEMPERATURE**2 * math.log(2)


def test_an_unknown_divergence_is_refused_with_the_ones_there_are() -> None:
    with pytest.raises(SpecError, match=r"divergence.*'forward', 'reverse' or 'jsd'"):
        digits_spec(loss="kd", divergence="tvd")
