"""The console script's entry point under a signal that lands during its imports."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.processes import started

# Runs the ``bench`` console script's entry point (as pyproject.toml names it) with the import of typer, the
# first heavy import behind the command line, held until a signal comes: where a Ctrl-C or SIGTERM lands in
# the first seconds of every command.
HELD_IN_IMPORTS = """
import importlib, sys, time, tomllib
class Held:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            print("importing", flush=True)
            time.sleep(60)
        return None
sys.meta_path.insert(0, Held())
target = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]["bench"]
module, _, function = target.partition(":")
sys.argv = ["bench", "env"]
getattr(importlib.import_module(module), function)()
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_during_the_imports_is_one_line_and_exits_130(signal_name: str) -> None:
    """Ctrl-C or SIGTERM during the imports is one line and exit status 130: the entry point takes both
    signals first.
    """
    with started([sys.executable, "-c", HELD_IN_IMPORTS]) as process:
        assert process.stdout.readline() == "importing\n"
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err == "bench: interrupted\n", err
