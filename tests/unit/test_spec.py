"""Spec validation, overrides and error messages. Tier: pure logic."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipebd_core.spec import Spec, SpecError, apply_overrides, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_bundled_examples_validate() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        assert isinstance(load_spec(path), Spec), path


def test_defaults_match_the_documented_contract() -> None:
    spec = parse_spec({})
    assert (spec.workload.kind, spec.workload.teacher, spec.workload.granularity) == ("compression", "vgg16", "layer")
    assert (spec.data.batch_size, spec.data.image_size, spec.schedule.mode) == (64, 32, "tr_dpu")
    assert spec.train.lr_schedule == "cosine"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"schedule": {"mode": "fast"}}, "schedule.mode"),
        ({"data": {"batch_size": 0}}, "data.batch_size: batch_size must be at least 1; got 0"),
        ({"train": {"epochs": "two"}}, "train.epochs"),
        ({"trian": {}}, "trian: not a field here; did you mean `train`?"),
        ({"workload": {"teacher": "resnet50"}}, "workload.teacher: 'resnet50' is not supported"),
        ({"workload": {"kind": "custom"}}, "workload.factory: kind 'custom' needs factory"),
        ({"workload": {"kind": "custom", "factory": "no colon"}}, "must look like 'package.module:function'"),
        ({"data": {"dataset": "cifar10"}}, "data.root: dataset 'cifar10' needs root"),
        ({"data": {"dataset": "custom"}}, "data.factory: dataset 'custom' needs factory"),
        ({"workload": {"kind": "nas", "layers_per_block": [2, 0]}}, "workload.layers_per_block: needs one count"),
        ({"schedule": {"mode": "hybrid"}}, "schedule.stages: mode 'hybrid' needs stages"),
        ({"schedule": {"mode": "auto", "profile": False}}, "schedule.profile: mode 'auto' plans from measured costs"),
        (
            {"schedule": {"mode": "dp", "stages": [{"start": 0, "stop": 1}]}},
            "schedule.stages: stages apply to modes tr, tr_dpu and hybrid",
        ),
        (
            {"schedule": {"mode": "hybrid", "stages": [{"start": 2, "stop": 2}]}},
            "stop (2) must be greater than start (2)",
        ),
        ({"name": "bad name!"}, "name: String should match pattern"),
    ],
)
def test_invalid_specs_name_the_field_and_the_reason(document: dict, expected: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(document)
    assert expected in str(error.value)


def test_overrides_are_parsed_as_yaml() -> None:
    stages = "schedule.stages=[{start: 0, stop: 2, replicas: 1}, {start: 2, stop: 5, replicas: 2}]"
    document = apply_overrides({"schedule": {"mode": "hybrid"}}, [stages, "train.epochs=3", "data.shuffle=false"])
    spec = parse_spec(document)
    assert [(s.start, s.stop, s.replicas) for s in spec.schedule.stages or []] == [(0, 2, 1), (2, 5, 2)]
    assert spec.train.epochs == 3 and spec.data.shuffle is False


def test_malformed_override_and_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"expected dotted\.key=value"):
        apply_overrides({}, ["train.epochs"])
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(listing)
