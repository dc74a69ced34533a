"""Reading the Helm chart without helm: its files, Helm's values merge, and the ConfigMap's config block.

No helm binary is available where these tests run, so nothing here executes Go templates. What this module
reproduces is small and exactly specified:

- Helm's values merge (``helm install -f override.yaml``): maps merge key by key, the override wins, lists and
  scalars are replaced whole, and an override of ``null`` deletes the key;
- the ConfigMap's ``config.yaml``, whose template is the single line ``toYaml .Values.config`` (a test pins
  that line), so the file the pod reads is the merged ``config`` mapping serialised as YAML;
- the environment the Deployment sets from the chart's Secret (``secret.yaml``, ``_env.tpl``): one
  ``RAGPROXY_*`` variable per non-empty ``secrets.*`` value, where ``llm-upstreams``
  (``ragproxy.llmUpstreamsWithKeys`` in ``_helpers.tpl``) is the ``config.upstreams.llm`` list with
  ``secrets.llmApiKeys`` filled in by position, as JSON.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ragproxy"
TEMPLATES = CHART / "templates"
EXAMPLES = CHART / "examples"


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: the top level must be a mapping"
    return data


def default_values() -> dict[str, Any]:
    return load_yaml(CHART / "values.yaml")


def example_files() -> list[Path]:
    """The documented value overrides (``examples/*.yaml``; the sidecar pod manifest lives in a subfolder)."""
    return sorted(EXAMPLES.glob("*.yaml"))


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of an override file over the chart's values."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def values_with(example: Path | None) -> dict[str, Any]:
    values = default_values()
    return values if example is None else merge_values(values, load_yaml(example))


def rendered_config(values: Mapping[str, Any]) -> str:
    """The ConfigMap's ``config.yaml``: ``toYaml .Values.config``."""
    return yaml.safe_dump(values["config"], sort_keys=True)


def llm_upstreams_secret(values: Mapping[str, Any]) -> str | None:
    """The Secret's ``llm-upstreams`` value, or ``None`` when no LLM keys are given."""
    keys = values.get("secrets", {}).get("llmApiKeys") or []
    if not keys:
        return None
    backends = []
    for index, backend in enumerate(values["config"]["upstreams"]["llm"]):
        copied = dict(backend)
        if index < len(keys) and keys[index]:
            copied["api_key"] = keys[index]
        backends.append(copied)
    return json.dumps(backends)


SECRET_ENVIRONMENT = {"adminToken": "RAGPROXY_ADMIN__TOKEN", "qdrantApiKey": "RAGPROXY_UPSTREAMS__QDRANT__API_KEY",
                      "embedderApiKey": "RAGPROXY_CACHE__L2__UPSTREAM_API_KEY",
                      "routingSaltSecret": "RAGPROXY_ROUTING__SALT_SECRET", "redisUrl": "RAGPROXY_REDIS__URL"}


def secret_environment(values: Mapping[str, Any]) -> dict[str, str]:
    """The RAGPROXY_* variables the pod gets from the chart's own Secret."""
    secrets = values.get("secrets", {})
    env = {name: str(secrets[key]) for key, name in SECRET_ENVIRONMENT.items() if secrets.get(key)}
    llm = llm_upstreams_secret(values)
    if llm is not None:
        env["RAGPROXY_UPSTREAMS__LLM"] = llm
    return env


def template_files() -> list[Path]:
    return sorted(p for p in TEMPLATES.iterdir() if p.suffix in (".yaml", ".tpl", ".txt"))


ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)


def actions(text: str) -> Iterator[str]:
    """The body of every ``{{ ... }}`` action, comments included (``/* ... */``)."""
    for match in ACTION.finditer(text):
        yield match.group(1)


def values_paths(node: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every key path of a values mapping (lists are leaves)."""
    paths: set[tuple[str, ...]] = set()
    if isinstance(node, Mapping):
        for key, value in node.items():
            path = (*prefix, str(key))
            paths.add(path)
            paths |= values_paths(value, path)
    return paths
