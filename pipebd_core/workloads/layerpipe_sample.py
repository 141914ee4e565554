"""The LayerPipe paper's four-layer sample network (its Fig. 1 and Table I), rebuilt to run on a CPU.

The paper gives four convolutional layers of different sizes on a 3-channel image, mapped by PipeDream
onto three processors as layer 1, layer 2, and layers 3 and 4 together, and balanced by LayerPipe by
letting a processor take over part of the delta of the layer before it. Table I's numbers are not in
the text we have, so this network is a reconstruction with that shape: the second layer dominates
(75.5 MFLOPs per sample forward at 32x32, against 1.8, 18.9 and 0.4 for the others; measured on one CPU
core at a micro-batch of 8, F + delta + G of 21, 1, 10 and 1 ms), so PipeDream's exact cut on three
stages is the paper's mapping and the third has room for part of layer 2's delta. Channel counts are
multiples of 16, the vector width of CPU convolution kernels: a slice of fewer input channels costs a
kernel about as much as 16 (measured: two 8-channel halves of a 16-channel input gradient took twice
the whole), a cost of the split, not of the work moved. `image_size`
32 instead of the paper's 224 keeps a step in milliseconds; the last layer has one channel per class,
averaged over the image into logits. Used by examples/layerpipe-sample.yaml (`workload.kind: train`).
"""

from __future__ import annotations

from torch import nn


def make_network(classes: int = 10) -> nn.Module:
    """conv 3->32, conv 32->128, conv 128->32 (stride 2), conv 32->classes (stride 2), all 3x3, ReLU between."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 128, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(128, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, classes, 3, stride=2, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
    )
