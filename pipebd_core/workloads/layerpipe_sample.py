"""The LayerPipe paper's four-layer sample network (its Fig. 1 and Table I), rebuilt to run on a CPU.

The paper gives four convolutional layers of different sizes on a 3-channel image, mapped by PipeDream
onto three processors as layer 1, layer 2, and layers 3 and 4 together, and balanced by LayerPipe by
letting a processor take over part of the delta of the layer before it. Table I's numbers are not in
the text we have, so this network is a reconstruction with that shape: the second layer dominates
(18.9 MFLOPs per sample forward at 32x32, against 0.9, 9.4 and 0.4 for the others), so PipeDream's
exact cut on three stages is the paper's mapping and the third has room for most of layer 2's delta. `image_size`
32 instead of the paper's 224 keeps a step in milliseconds; the last layer has one channel per class,
averaged over the image into logits. Used by examples/layerpipe-sample.yaml (`workload.kind: train`).
"""

from __future__ import annotations

from torch import nn


def make_network(classes: int = 10) -> nn.Module:
    """conv 3->16, conv 16->64, conv 64->32 (stride 2), conv 32->classes (stride 2), all 3x3, ReLU between."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, classes, 3, stride=2, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
    )
