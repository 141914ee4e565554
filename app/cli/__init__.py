"""The `pipebd` command line: the engine's commands and the service's (up, api, worker, submit, pause, resume)."""

from app.cli.main import main

__all__ = ["main"]
