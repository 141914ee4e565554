"""Typed documents: every JSON document that crosses a process or a package (the profiles, the plans and
their predictions, calibration, the re-plan history, telemetry lines, rank error reports, the summary,
the phases record), one model each, with a format version. Torch-free: the API, the dashboard and the
worker read them without loading torch.
"""
