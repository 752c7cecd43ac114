"""The CPU suite; its folders mirror the packages, and ``product/`` holds whole-product tests."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
