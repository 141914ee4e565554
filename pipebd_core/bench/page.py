"""The benchmarks page's generated sections: each is the report of committed benchmark records.

A section of docs/benchmarks.md that comes from records sits between two markers:

    <!-- pipebd bench --report benchmarks/records/vgg16-dsconv.json -->
    ...the report of those records, exactly as `pipebd bench --report` prints it...
    <!-- end of report -->

`regenerate` replaces what is between every pair with the report of the records its opening marker
names (paths relative to the repository root), leaving the rest of the page as it is; `pipebd bench
--update-page docs/benchmarks.md` writes it back, and the suite checks that the page equals its
regeneration, so no figure of a generated section is ever typed.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipebd_core.bench.report import load_record, render

SECTION = re.compile(
    r"(?P<open><!-- pipebd bench --report (?P<paths>[^>]+?) -->\n)(?P<body>.*?)(?P<close><!-- end of report -->)",
    re.DOTALL,
)


def record_paths(page: str) -> list[list[str]]:
    """The record files each generated section of the page names, in page order."""
    return [match["paths"].split() for match in SECTION.finditer(page)]


def regenerate(page: str, root: Path) -> str:
    """The page with every generated section rendered again from its records under `root`."""

    def rendered(match: re.Match[str]) -> str:
        records = [load_record(root / path) for path in match["paths"].split()]
        return match["open"] + "\n" + render(records) + "\n" + match["close"]

    return SECTION.sub(rendered, page)
