"""The repository under test, its stack files, and the examples its README and manual (docs/) show."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod", "existing")


def manual_pages() -> list[Path]:
    """README.md, the front door, and the manual's pages (docs/*.md, built by `make docs`)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_example(name: str) -> str:
    """The ```bash block right under ``<!-- name -->`` in README.md or a page of docs/, wherever the example lives; a
    marker's name is unique over all of them."""
    marker = f"<!-- {name} -->"
    pages = [page for page in manual_pages() if marker in page.read_text()]
    assert len(pages) == 1, f"{marker} should be in exactly one of README.md and docs/*.md, not {pages}"
    (page,) = pages
    match = re.search(rf"{marker}\n```bash\n(.*?)```", page.read_text(), re.S)
    assert match, f"{page.relative_to(REPO)} has no ```bash block right under {marker}"
    return match.group(1)
