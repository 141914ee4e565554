"""The new-job page (`/jobs/new`): a spec editor prefilled from the bundled examples, or with `?spec=` (the
model page's "compress further" and "fine-tune" links, app/web/models.py).

The page's script posts the editor's text to `POST /api/v1/jobs` as YAML, exactly as the `curl`
command shown under the editor does; a 422 answer names each bad field, and the script shows each
message next to that field's line in the editor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.web.access import SubmitterDep
from app.web.routing import PageRoute
from app.web.templating import REPO, render

EXAMPLES = REPO / "examples"
DEFAULT_EXAMPLE = "tiny-custom.yaml"  # runs in seconds anywhere
SPEC_CHARS = 20_000  # a spec handed in the address (`?spec=`: the model page's "compress further") at most

router = APIRouter(route_class=PageRoute)


def bundled_examples(folder: Path = EXAMPLES) -> dict[str, str]:
    """File name -> text of every YAML example, in name order."""
    return {path.name: path.read_text() for path in sorted(folder.glob("*.yaml"))}


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(
    request: Request,
    viewer: SubmitterDep,
    example: str | None = None,
    spec: Annotated[str | None, Query(max_length=SPEC_CHARS)] = None,
) -> HTMLResponse:
    examples = bundled_examples()
    errors = {}
    chosen = example if example in examples else DEFAULT_EXAMPLE if DEFAULT_EXAMPLE in examples else None
    if example is not None and example not in examples:
        errors["example"] = f"There is no bundled example {example!r}; pick one of the list."
    if chosen is None and examples:
        chosen = next(iter(examples))
    context = {
        "examples": examples,
        "chosen": chosen,
        "text": spec if spec is not None else examples.get(chosen or "", ""),
        "api_url": f"{str(request.base_url).rstrip('/')}/api/v1/jobs",
        "errors": errors,
    }
    return render(request, "jobs/new.html", context, status_code=422 if errors else 200)
