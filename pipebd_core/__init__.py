"""PipeBD engine: pipelined blockwise knowledge distillation across the ranks of one node."""

__version__ = "0.1.0"
