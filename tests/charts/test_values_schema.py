"""values.yaml and every documented override (``examples/*.yaml``) validate against values.schema.json.

Verified: the schema is a valid JSON Schema (draft-07, what Helm 3 checks values against), the chart's defaults
and each example merged over them the way Helm merges ``-f`` files validate, and the schema rejects values it
should (so the check can fail). Not verified: that Helm itself accepts the chart (no helm binary here); the
settings inside ``config`` beyond the keys the templates read (that is ``ragproxy check-config``'s job, see
test_rendered_config.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.charts.chart_source import CHART, example_files, merge_values, values_with


def schema() -> dict[str, Any]:
    data = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_schema_is_valid_draft7() -> None:
    jsonschema.Draft7Validator.check_schema(schema())


def test_examples_exist() -> None:
    names = {path.name for path in example_files()}
    assert {"sidecar.yaml", "single-node.yaml"} <= names


@pytest.mark.parametrize("example", [None, *example_files()], ids=lambda p: "values.yaml" if p is None else p.name)
def test_values_validate(example: Path | None) -> None:
    jsonschema.validate(values_with(example), schema())


@pytest.mark.parametrize(
    "override",
    [
        {"mode": "daemonset"},
        {"config": {"server": {"port": 0}}},
        {"config": {"data_dir": "relative/path"}},
        {"config": {"upstreams": {"llm": []}}},
        {"service": {"type": "Ingress"}},
        {"secrets": {"adminToken": 123}},
        {"unknownTopLevel": True},
        {"probes": {"readiness": {"path": "readyz"}}},
    ],
)
def test_schema_rejects(override: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merge_values(values_with(None), override), schema())


def test_helm_merge_semantics() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    merged = merge_values(base, {"a": {"c": [3], "e": 2}, "d": None})
    assert merged == {"a": {"b": 1, "c": [3], "e": 2}}
