"""Tracking export: a job's telemetry as the scalar series that TensorBoard and MLflow show.

`scalars` turns a training phase's telemetry lines into named series (the one naming both exports
share); `tensorboard` writes them as event files under the run directory. The MLflow export, a
service feature, lives with the worker (worker/tracking.py).
"""
