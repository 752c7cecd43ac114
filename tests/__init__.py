"""The CPU suite; its folders mirror the packages, and ``product/`` holds whole-product tests."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment now, with this checkout's packages importable, and ``extra``."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}
