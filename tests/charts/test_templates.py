"""Static checks of the chart's templates (no helm binary here, so no template is executed).

Verified: every ``.Values.*`` path the templates read exists in values.yaml; ``{{``/``}}`` are balanced and
``if``/``range``/``with``/``define`` blocks close in order with ``end`` (``else`` only inside them);
``include``/``template`` only name helpers the chart defines; ``.Chart.*`` fields used are set in Chart.yaml;
the ConfigMap renders ``values.config`` verbatim (the premise of test_rendered_config.py); probes, ports and the
security context are wired to the values that document them. Not verified: that the templates execute, that
the output is valid Kubernetes YAML, or that the objects are accepted by an API server (``helm lint`` /
``helm template | kubeconform`` where helm is available).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.charts.chart_source import (
    CHART,
    TEMPLATES,
    actions,
    default_values,
    example_files,
    load_yaml,
    template_files,
    values_paths,
    values_with,
)

VALUES_PATH = re.compile(r"\$?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
INCLUDE = re.compile(r"\b(?:include|template)\s+\"([^\"]+)\"")
DEFINE = re.compile(r"^define\s+\"([^\"]+)\"$")
OPENERS = ("if", "range", "with", "define", "block")


def all_text() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in template_files()}


def test_templates_present() -> None:
    names = {path.name for path in template_files()}
    assert {"_helpers.tpl", "deployment.yaml", "service.yaml", "configmap.yaml", "secret.yaml", "hpa.yaml",
            "pdb.yaml", "servicemonitor.yaml", "NOTES.txt"} <= names


def test_values_paths_exist() -> None:
    known = values_paths(default_values())
    missing = sorted(
        f"{path.name}: .Values{match}"
        for path, text in all_text().items()
        for match in VALUES_PATH.findall(text)
        if tuple(match.lstrip(".").split(".")) not in known
    )
    assert not missing, missing


@pytest.mark.parametrize("path", template_files(), ids=lambda p: p.name)
def test_delimiters_balanced(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count("{{") == text.count("}}"), "unbalanced {{ }}"
    depth = 0
    for token in re.findall(r"\{\{|\}\}", text):
        depth += 1 if token == "{{" else -1
        assert depth in (0, 1), "nested or stray delimiters"


@pytest.mark.parametrize("path", template_files(), ids=lambda p: p.name)
def test_blocks_balanced(path: Path) -> None:
    stack: list[str] = []
    for action in actions(path.read_text(encoding="utf-8")):
        if action.startswith("/*"):
            assert action.endswith("*/"), f"unterminated comment: {action[:40]!r}"
            continue
        word = action.split()[0] if action.split() else ""
        if word in OPENERS:
            stack.append(word)
        elif word == "else":
            assert stack and stack[-1] in ("if", "with", "range"), f"else outside a block in {path.name}"
        elif word == "end":
            assert stack, f"end without a block in {path.name}"
            stack.pop()
    assert not stack, f"unclosed blocks in {path.name}: {stack}"


def test_includes_are_defined() -> None:
    texts = all_text()
    defined = {name for text in texts.values() for action in actions(text)
               for name in DEFINE.findall(action)}
    used = {name for text in texts.values() for name in INCLUDE.findall(text)}
    assert used - defined == set(), f"helpers used but not defined: {sorted(used - defined)}"
    assert defined - used == set(), f"helpers defined but never used: {sorted(defined - used)}"
    assert all(name.startswith("ragproxy.") for name in defined)


def test_chart_fields_exist() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2" and chart["name"] == "ragproxy"
    fields = {match for text in all_text().values() for match in re.findall(r"\.Chart\.([A-Za-z]+)", text)}
    keys = {key[0].upper() + key[1:] for key in chart}
    assert fields <= keys, f".Chart fields not in Chart.yaml: {fields - keys}"


def test_configmap_renders_config_verbatim() -> None:
    text = (TEMPLATES / "configmap.yaml").read_text(encoding="utf-8")
    assert "  config.yaml: |\n    {{- toYaml .Values.config | nindent 4 }}\n" in text


def test_deployment_wiring() -> None:
    text = (TEMPLATES / "deployment.yaml").read_text(encoding="utf-8")
    values = default_values()
    assert values["probes"]["liveness"]["path"] == "/healthz"
    assert values["probes"]["readiness"]["path"] == "/readyz"
    assert "path: {{ .Values.probes.liveness.path }}" in text
    assert "path: {{ .Values.probes.readiness.path }}" in text
    assert "containerPort: {{ .Values.config.server.port }}" in text
    assert "containerPort: {{ .Values.config.admin.port }}" in text
    assert "mountPath: {{ .Values.config.data_dir }}" in text
    assert "{{- toYaml .Values.securityContext | nindent 12 }}" in text
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["podSecurityContext"]["runAsUser"] != 0
    assert values["config"]["server"]["port"] == 8080 and values["config"]["admin"]["port"] == 8081
    # Drain finishes before the kubelet's SIGKILL.
    assert values["terminationGracePeriodSeconds"] > values["config"]["server"]["shutdown_grace_s"]


def test_sidecar_manifest_matches_chart() -> None:
    """The documented sidecar pod mounts the chart's ConfigMap and runs the image as the chart does."""
    manifest = load_yaml(CHART / "examples" / "sidecar" / "app-deployment.yaml")
    pod = manifest["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "ragproxy")
    sidecar_values = load_yaml(CHART / "examples" / "sidecar.yaml")
    assert proxy["args"] == ["serve"]
    assert {"name": "RAGPROXY_CONFIG", "value": "/etc/ragproxy/config.yaml"} in proxy["env"]
    mounts = {m["mountPath"] for m in proxy["volumeMounts"]}
    assert {"/etc/ragproxy", sidecar_values["config"]["data_dir"]} <= mounts
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert proxy["readinessProbe"]["httpGet"]["port"] == sidecar_values["config"]["server"]["port"]


def _quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


@pytest.mark.parametrize("example", [None, *example_files()], ids=lambda p: "values.yaml" if p is None else p.name)
def test_cold_tier_fits_the_data_volume(example: Path | None) -> None:
    """The cold tier's byte budget stays below the volume mounted at data_dir (else the kubelet evicts the pod)."""
    values = values_with(example)
    l3 = values["config"].get("cache", {}).get("l3", {})
    if l3.get("enabled") is False:
        return
    assert "max_bytes" in l3, "set config.cache.l3.max_bytes to fit the volume (the default is 8 GiB)"
    persistence = values["persistence"]
    volume = persistence["size"] if persistence["enabled"] else persistence["emptyDirSizeLimit"]
    assert l3["max_bytes"] <= 0.9 * _quantity_bytes(volume)
