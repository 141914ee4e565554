"""Benchmarks: modes and strategies side by side in one run, their records and report, the re-planning
recovery, synthetic load."""
