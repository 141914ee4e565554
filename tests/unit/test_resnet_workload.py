"""The ResNet-18 custom workload (pipebd_core/workloads/resnet.py): torchvision's network cut at its
residual blocks, each student giving its teacher block's shape, the teacher blocks in order giving
torchvision's own logits."""

from __future__ import annotations

import torch
from torchvision.models import resnet18

from pipebd_core.workloads.resnet import make_blocks


def test_the_blocks_in_order_are_resnet18_and_each_student_has_its_teachers_shape() -> None:
    torch.manual_seed(0)
    teachers, students = make_blocks(num_classes=10)
    torch.manual_seed(0)
    whole = resnet18(num_classes=10).eval()
    assert len(teachers) == len(students) == 10  # stem, eight BasicBlocks, head
    x = torch.randn(2, 3, 32, 32)
    hidden = x
    with torch.no_grad():
        for teacher, student in zip(teachers, students, strict=True):
            out = teacher.eval()(hidden)
            assert student.eval()(hidden).shape == out.shape
            hidden = out
        assert torch.allclose(hidden, whole(x), atol=1e-5)
