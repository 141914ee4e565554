"""Real torchrun jobs with gloo ranks on CPU: every mode against the sequential reference, resume,
failures, telemetry."""
