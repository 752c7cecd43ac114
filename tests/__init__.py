"""The CPU suite; its folders mirror the packages, and ``product/`` holds whole-product tests."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A child Python process's environment: it imports this checkout's packages.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
