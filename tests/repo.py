"""The repository under test and its stack files."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod", "existing")
