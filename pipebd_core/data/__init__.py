"""Data sets (synthetic, digits, CIFAR-10, ImageFolder, custom) and the deterministic global batch order
shared by every execution mode.
"""
