"""The docs hold together: links resolve, and every document and section the code cites
exists in the repository (nothing outside it is cited)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [
    path
    for folder in (
        "elastune",
        "flows",
        "tasks",
        "planners",
        "infra",
        "examples",
        "benchmarks",
        "tests",
    )
    for path in (ROOT / folder).rglob("*")
    if path.suffix in {".py", ".yaml", ".md"}
] + [ROOT / "pyproject.toml", ROOT / "prefect.yaml", ROOT / "Makefile"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
UPWARD = re.compile(r"\.\./[\w./-]+")
CITE = re.compile(r"(docs/[\w-]+\.md)((?:[ ,]*(?:and |-|–)?§[0-9][0-9.]*[0-9]?)*)")


def prose(path: Path) -> list[tuple[int, str]]:
    """Numbered lines of a markdown page outside code fences."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path):
        heading = re.match(r"^#{1,6} (.*)", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1).strip().lower())
            slug = re.sub(r"[^\w\- ]", "", text.replace("`", "")).replace(" ", "-")
            n = seen.get(slug, 0)
            out.add(slug if n == 0 else f"{slug}-{n}")
            seen[slug] = n + 1
    return out


def sections(path: Path) -> set[str]:
    text = path.read_text()
    return set(re.findall(r"^#{2,4} §([0-9.]*[0-9])", text, re.M)) | set(
        re.findall(r"\*\*§([0-9.]*[0-9])", text)
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(page: Path) -> None:
    problems = []
    for number, line in prose(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists() or not dest.is_relative_to(ROOT):
                problems.append(f"{number}: {target}: no such file in the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{number}: {target}: no such heading")
    assert not problems, problems


def test_every_cited_document_and_section_exists() -> None:
    problems = []
    for path in CODE:
        text = path.read_text()
        where = path.relative_to(ROOT)
        for old in ("ALGORITHMS.md", "ARCHITECTURE.md", "STACK.md"):
            if old in text and path.name != "test_docs.py":
                problems.append(f"{where}: cites {old}, which is not in the repository")
        # A path climbing a folder must land on a file of the repository from where it is
        # written (a link); else it names what a fresh clone does not have beside it.
        for climbing in UPWARD.findall(text):
            target = (path.parent / climbing.rstrip(".")).resolve()
            if not (target.exists() and target.is_relative_to(ROOT)):
                problems.append(f"{where}: names {climbing}, not in the repository")
        for document, cited in CITE.findall(text):
            if not (ROOT / document).exists():
                problems.append(f"{where}: cites {document}, which does not exist")
                continue
            held = sections(ROOT / document)
            for number in re.findall(r"§([0-9][0-9.]*[0-9]|[0-9])", cited):
                if number not in held:
                    problems.append(
                        f"{where}: cites {document} §{number}, which has no such section"
                    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_the_docs_name_exist(page: Path) -> None:
    named = re.compile(
        r"`((?:flows|tasks|planners|infra|tests|benchmarks|examples|docs)/[\w./-]*)`"
    )
    missing = [
        f"{number}: {path}"
        for number, line in prose(page)
        for path in named.findall(line)
        if not (ROOT / path.split(":")[0].rstrip("/")).exists()
    ]
    assert not missing, missing


# What a page must not say: history lives in git and in benchmarks/results/, a page states
# today's behaviour and figures. Work sessions, issue numbers, numbered rounds of work and
# runs named by letters ("run AL", "runs P-T") are the forms a lab notebook takes.
HISTORY = re.compile(
    r"(?i:\bsessions? \d+|\bissues? \d+|\brounds? \d+)"
    r"|(?:^|[\s(,;])#\d+\b(?!-)"
    r"|\bruns? [A-Z]{1,2}(?:-[A-Z]{1,2})?\b(?![.'-]?[a-z])"
)
URL = re.compile(r"https?://\S+")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_state_behaviour_not_history(page: Path) -> None:
    found = [
        f"{number}: {match.group(0).strip()!r}"
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in HISTORY.finditer(URL.sub("", line))
    ]
    assert not found, found


def test_code_states_behaviour_not_history() -> None:
    """Docstrings and comments speak of the project as it is, as the pages do."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0).strip()!r}"
        for path in CODE
        if path.name != "test_docs.py"  # its own examples of what is refused
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in HISTORY.finditer(URL.sub("", line))
        if not re.search(r"``[^`]*" + re.escape(match.group(0).strip()), line)  # code, quoted
    ]
    assert not found, found


def test_history_guard_catches_the_notebook_forms() -> None:
    for text in (
        "since session 48",
        "Issue 13's goals",
        "fixes #12",
        "run AL",
        "runs P-T",
        "round 3",
    ):
        assert HISTORY.search(text), text
    for text in ("a test session", "[§5](#5-a-job)", "the run. A job", "run ECS", "rounds up"):
        assert not HISTORY.search(text), text


def test_the_index_names_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, f"docs/README.md does not link {sorted(pages - linked)}"


KINDS = ("*Tutorial", "*How-to", "*Reference", "*Explanation", "*Benchmarks")


@pytest.mark.parametrize(
    "page",
    [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md"],
    ids=lambda p: p.name,
)
def test_each_page_says_which_kind_it_is(page: Path) -> None:
    """The index promises that each page's first line under its title names its kind."""
    first = next(line for _, line in prose(page)[1:] if line.strip())
    assert first.startswith(KINDS), f"{page.name} begins {first[:40]!r}, not one of {KINDS}"
