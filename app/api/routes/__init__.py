"""Routers, one per resource: jobs, metrics, logs, artifacts, events, health."""
