"""Reading the project's Markdown pages (README.md, docs/*.md) for tests/unit/test_docs.py.

What a page shows, each with the file and line it is on: fenced code blocks (their language and
text), shell commands (continuation lines joined, comments dropped), inline code spans, links and
the anchors its headings give (GitHub's slugs).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL = ("sh", "bash", "shell", "console")
FENCE = re.compile(r"^```(\w*)\s*$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\[[^\]\n]+\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")


@dataclass(frozen=True)
class Where:
    page: Path
    line: int

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Block:
    where: Where  # the line of its opening fence
    language: str
    text: str


@dataclass(frozen=True)
class Command:
    where: Where
    argv: list[str]

    def __str__(self) -> str:
        return shlex.join(self.argv)


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines: list[str] = []
    language: str | None = None  # of the block being read; None outside blocks
    start = 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and language is None:
            language, start, lines = fence.group(1).lower(), number, []
        elif line.startswith("```") and language is not None:
            found.append(Block(Where(page, start), language, "\n".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    return found


def prose(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside the fenced code blocks."""
    lines: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: continuation lines joined, comment lines and comments dropped."""
    found: list[Command] = []
    pending, first = "", 0
    for offset, line in enumerate(block.text.splitlines(), 1):
        if not pending:
            first = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        argv = shlex.split(pending + line, comments=True)
        pending = ""
        if argv:
            found.append(Command(Where(block.where.page, block.where.line + first), argv))
    return found


def spans(page: Path) -> list[tuple[Where, str]]:
    return [(Where(page, number), span) for number, line in prose(page) for span in SPAN.findall(line)]


def links(page: Path) -> list[tuple[Where, str]]:
    return [(Where(page, number), target) for number, line in prose(page) for target in LINK.findall(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(match.group(1)) for _, line in prose(page) if (match := HEADING.match(line))}
