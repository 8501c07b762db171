"""The repository under test and its stack files."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod", "existing")


def readme_example(name: str) -> str:
    """The ```bash block right under ``<!-- name -->`` in README.md."""
    match = re.search(rf"<!-- {name} -->\n```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert match, f"README.md has no ```bash block right under <!-- {name} -->"
    return match.group(1)
