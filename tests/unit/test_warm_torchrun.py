"""The warm torchrun's rank entry: `-m NAME` runs what `python -m NAME` would (a package's `__main__`),
and a rank that raises leaves its traceback on its stderr, as a fresh interpreter does on exit."""

from __future__ import annotations

import signal
import sys
import types

import pytest

from pipebd_core.job import warm_torchrun


def test_a_package_runs_its_main_module_and_a_module_itself() -> None:
    assert warm_torchrun.rank_module("pipebd_core.distill").__name__ == "pipebd_core.distill.__main__"
    assert warm_torchrun.rank_module("pipebd_core.distill.finalize").__name__ == "pipebd_core.distill.finalize"


def test_a_rank_that_raises_prints_its_traceback_and_gets_fresh_signal_handlers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    handlers: dict[int, object] = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handlers.__setitem__(signum, handler))

    def main(argv: list[str]) -> None:
        raise RuntimeError(f"rank failed with {argv}")

    monkeypatch.setitem(sys.modules, "crashing_rank", types.SimpleNamespace(main=main))
    with pytest.raises(RuntimeError):
        warm_torchrun.run_rank("crashing_rank", ["--run-dir", "x"])
    assert "RuntimeError: rank failed with ['--run-dir', 'x']" in capsys.readouterr().err
    assert handlers == {
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGINT: signal.default_int_handler,
        signal.SIGHUP: signal.SIG_DFL,
        signal.SIGQUIT: signal.SIG_DFL,
    }
