"""The front door and the manual. README.md stays short, and its links hold: `make docs` (MkDocs, strict) checks every
link and anchor of the manual's pages in docs/, but not README.md, which lies outside them. The layout page names
the tree as it is: every path it names exists, and every top-level folder of the repository and every folder of the
training package is named there, so moving one fails here until the page moves with it."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

from tests.repo import REPO

README = REPO / "README.md"
LAYOUT = REPO / "docs" / "layout.md"
PACKAGE = "training/spotray"
README_MAX_LINES = 200  # the bound: what a newcomer reads first
PATH = re.compile(r"[\w.*-]+(/[\w.*-]+)*/?")  # a path in backticks: `infra/kernel/`, `infra/*.py`, `.ci/run`
MODULE = re.compile(r"[\w-]+\.py")  # a bare module name: in the folder its table row names, else at the root


def prose(markdown: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a bash block is no heading, a `[x](y)` there no link)."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)


def slug(heading: str) -> str:
    """The id MkDocs gives a heading (Python-Markdown's toc): inline markup dropped, non-ASCII and punctuation other
    than hyphens dropped, lower case, runs of spaces and hyphens made one hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    """The ids of a page's headings; a repeated one gets _1, _2, ... as toc numbers them."""
    ids: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(page.read_text()), re.M):
        base = found = slug(heading)
        n = 0
        while found in ids:
            n += 1
            found = f"{base}_{n}"
        ids.add(found)
    return ids


def links(page: Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(page.read_text()))


def tracked_folders() -> set[str]:
    """Every folder at the repository's top level and every folder of the training package that git tracks a file
    in (so caches, build outputs and virtualenvs are left out)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    top = {file.split("/")[0] for file in files if "/" in file}
    package = {str(Path(file).parent) for file in files if file.startswith(f"{PACKAGE}/")}
    inner = {str(folder) for name in package for folder in [Path(name), *Path(name).parents]
             if str(folder).startswith(f"{PACKAGE}/")}
    return top | inner


def named_paths(page: str) -> tuple[set[str], list[str]]:
    """The paths a page names in backticks (from the repository root), and the problems: a named path that does not
    exist, or a bare module name that is in neither the folders its table row names first nor the root."""
    named: set[str] = set()
    missing: list[str] = []
    for line in prose(page).splitlines():
        cells = line.strip().strip("|").split("|") if line.lstrip().startswith("|") else [""]
        bases = [REPO]
        for token in re.findall(r"`([^`]+)`", cells[0]):
            if "/" in token and PATH.fullmatch(token):
                bases += [match if match.is_dir() else match.parent for match in REPO.glob(token.rstrip("/"))]
        for token in re.findall(r"`([^`]+)`", line):
            if "/" in token and PATH.fullmatch(token) and "://" not in token:
                if any(REPO.glob(token.rstrip("/"))):
                    named.add(token.rstrip("/"))
                else:
                    missing.append(token)
            elif MODULE.fullmatch(token) and not any((base / token).is_file() for base in bases):
                missing.append(f"{token} (in {', '.join(str(base.relative_to(REPO)) for base in bases)})")
    return named, missing


def test_the_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move what is not set-up or the tour to docs/"


def test_every_link_of_the_readme_reaches_its_file_and_anchor():
    broken = []
    for link in links(README):
        if re.match(r"[a-z][\w+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve() if target else README
        if not path.exists():
            broken.append(f"{link}: no {target}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: {target or 'README.md'} has no heading #{anchor}")
    assert links(README), "README.md links to no page of the manual"
    assert not broken, broken


def unnamed(named: set[str], folders: set[str]) -> list[str]:
    """The folders that no named path is, or lies in."""
    return sorted(folder for folder in folders if not any(path == folder or path.startswith(f"{folder}/")
                                                          for path in named))


def test_the_layout_page_names_every_path_it_should_and_only_paths_that_exist():
    named, missing = named_paths(LAYOUT.read_text())
    assert not missing, f"docs/layout.md names what is not in the tree: {missing}"
    folders = unnamed(named, tracked_folders())
    assert not folders, f"docs/layout.md does not name these folders: {folders}"


def test_the_layout_check_sees_a_moved_module_and_a_new_folder():
    page = LAYOUT.read_text()
    moved = page.replace("`training/spotray/driver/`", "`training/spotray/launcher/`")
    assert {"training/spotray/launcher/", "launch.py (in .)"} <= set(named_paths(moved)[1])
    renamed = page.replace("`chunks.py`", "`chunk.py`")
    assert named_paths(renamed)[1] == [f"chunk.py (in ., {PACKAGE}/data)"]
    named, _ = named_paths(page)
    assert unnamed(named, {f"{PACKAGE}/tasks", f"{PACKAGE}/train"}) == [f"{PACKAGE}/train"]
