"""Documents are typed where their shape is known (issue 37): the sources under app, worker and pipebd_core
hold at most MOST_ANY_DICTS `dict[str, Any]` (an alias of it counts once, where it is defined), and the API's
typed bodies of plan.json and architecture.json give back each file exactly as written, unknown keys
included, with a schema that names every part."""

from __future__ import annotations

import json
from pathlib import Path

from app.api.model_schemas import ModelArchitecture
from app.api.schemas import Plan
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
from tests.unit.plan_samples import PLAN_SAMPLE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "worker", "pipebd_core")
ANY_DICT = "dict[str, Any]"
MOST_ANY_DICTS = 120


def any_dicts(root: Path) -> list[str]:
    """`path:line` of each `dict[str, Any]` in the Python sources of the packages under `root`."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{path.relative_to(root)}:{number}"] * line.count(ANY_DICT)
    return found


def test_untyped_dicts_stay_under_the_bound() -> None:
    found = any_dicts(ROOT)
    assert len(found) > 50, f"only {len(found)} found: the count does not read the sources"
    assert len(found) <= MOST_ANY_DICTS, (
        f"{len(found)} `{ANY_DICT}` in {', '.join(PACKAGES)} (at most {MOST_ANY_DICTS}): type the new ones with a"
        f" model or a TypedDict where the shape is known (pipebd_core/documents, app/api/schemas.py)\n"
        + "\n".join(found[-20:])
    )


def test_the_count_sees_every_one(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "worker" / "deep").mkdir(parents=True)
    (tmp_path / "app" / "a.py").write_text("x: dict[str, Any] = {}\ndef f(y: dict[str, Any]) -> dict[str, Any]: ...\n")
    (tmp_path / "worker" / "deep" / "b.py").write_text("Alias = dict[str, Any]\nz: dict[str, int] = {}\n")
    (tmp_path / "app" / "notes.md").write_text("dict[str, Any]\n")
    assert any_dicts(tmp_path) == ["app/a.py:1", "app/a.py:2", "app/a.py:2", "worker/deep/b.py:1"]


def test_the_plan_body_gives_plan_json_back_as_written() -> None:
    written = json.loads(json.dumps(PLAN_SAMPLE.to_json()))
    assert {"streams", "search", "estimates", "alternatives", "simulation", "profile_trust", "replans"} <= set(written)
    written["from_a_newer_engine"] = {"kept": [1, 2.5]}
    written["profile_trust"]["noisy"] = [
        {"what": "data loading", "block": None, "batch": 8, "spread": 1, "remeasured": 2}
    ]
    body = Plan.model_validate(written)
    assert body.model_dump(mode="json", exclude_unset=True) == written
    assert body.profile_trust is not None and body.profile_trust.noisy[0].spread == 1  # an int stays an int
    assert isinstance(body.profile_trust.noisy[0].spread, int)
    assert body.simulation is not None and body.simulation["chosen"].segments[0].kind == "teacher"
    properties = Plan.model_json_schema(mode="serialization")["properties"]
    for name in ("streams", "search", "estimates", "alternatives", "simulation", "profile_trust"):
        assert "$ref" in json.dumps(properties[name]), f"{name} is not a typed part: {properties[name]}"


def test_a_model_s_architecture_is_served_as_written() -> None:
    searched = Architecture(
        blocks=[ArchitectureBlock(block=0, layers=["ffn_1/2"], loss=0.25, params=10, kv_cache_bytes=0)],
        candidates=[CandidateResult(block=0, name="ffn_1/2", loss=0.25, params=10)],
        chosen_by="lowest loss",
        reached={"params": 0.5},
    ).to_json()
    nas = {**Architecture(blocks=[ArchitectureBlock(block=1, layers=["conv3", "skip"])]).to_json(), "later": 1}
    for written in (searched, nas):
        body = ModelArchitecture.model_validate(written)
        assert body.model_dump(mode="json") == written  # no key added as null, none dropped
    assert "candidates" not in nas and ModelArchitecture.model_validate(nas).blocks[0].layers == ["conv3", "skip"]
    schema = ModelArchitecture.model_json_schema(mode="serialization")
    assert {"blocks", "candidates", "reached"} <= set(schema["properties"]) and "ArchitectureChoice" in schema["$defs"]
