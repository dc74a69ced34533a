"""The config the chart renders into its ConfigMap is accepted by ``ragproxy check-config``.

Verified, for values.yaml and every ``examples/*.yaml`` merged over it: the ``config.yaml`` the ConfigMap
carries (``toYaml .Values.config``, reproduced by :mod:`tests.charts.chart_source`) together with the
environment the Deployment sets from the chart's Secret (admin token, Qdrant key, Redis URL, LLM keys) is
accepted by the real ``ragproxy check-config`` (exit code 0), and the effective settings keep the ports and
data_dir the templates use. A config with a misspelt key is refused (exit code 2), so the check can fail. Every
``SecretStr`` setting of ``proxy.assembly.config.Settings`` has a chart secret that reaches the pod's environment.
Not verified: the Go template execution itself (no helm binary here), or that the upstream URLs answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from tests.charts.chart_source import (
    CHART,
    SECRET_ENVIRONMENT,
    example_files,
    llm_upstreams_secret,
    rendered_config,
    secret_environment,
    values_with,
)


def check_config(
    config_text: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(config_text, encoding="utf-8")
    script = shutil.which("ragproxy", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "commands.cli"]
    clean = {key: value for key, value in os.environ.items() if not key.startswith("RAGPROXY_")}
    return subprocess.run([*command, "check-config", "--config", str(config)], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("example", [None, *example_files()], ids=lambda p: "values.yaml" if p is None else p.name)
def test_rendered_config_is_accepted(example: Path | None, tmp_path: Path) -> None:
    values = values_with(example)
    env = secret_environment(values)
    result = check_config(rendered_config(values), tmp_path, env)
    assert result.returncode == 0, result.stderr
    effective: dict[str, Any] = yaml.safe_load(result.stdout)
    config = values["config"]
    assert effective["server"]["port"] == config["server"]["port"]
    assert effective["server"]["host"] == config["server"]["host"]
    assert effective["admin"]["port"] == config["admin"]["port"]
    assert effective["data_dir"] == config["data_dir"]
    assert [b["url"] for b in effective["upstreams"]["llm"]] == [
        b["url"].rstrip("/") for b in config["upstreams"]["llm"]
    ]
    secrets = values["secrets"]
    for secret in [secrets["adminToken"], secrets["qdrantApiKey"], *secrets["llmApiKeys"]]:
        if secret:
            assert secret not in result.stdout, "secrets must be masked in check-config's output"


def test_llm_keys_secret_fills_by_position() -> None:
    values = values_with(None)
    values["config"]["upstreams"]["llm"] = [{"url": "http://a:8000"}, {"url": "http://b:8000"}]
    values["secrets"]["llmApiKeys"] = ["", "key-b"]
    secret = llm_upstreams_secret(values)
    assert secret is not None
    assert json.loads(secret) == [{"url": "http://a:8000"}, {"url": "http://b:8000", "api_key": "key-b"}]


def test_secret_environment_is_accepted(tmp_path: Path) -> None:
    values = values_with(None)
    values["secrets"].update({"adminToken": "t0ken-admin", "qdrantApiKey": "qdrant-key", "embedderApiKey": "emb-key",
                              "routingSaltSecret": "salt-secret", "redisUrl": "redis://:pw@redis:6379/0",
                              "llmApiKeys": ["sk-upstream"]})
    env = secret_environment(values)
    assert set(env) == {"RAGPROXY_ADMIN__TOKEN", "RAGPROXY_UPSTREAMS__QDRANT__API_KEY", "RAGPROXY_REDIS__URL",
                        "RAGPROXY_CACHE__L2__UPSTREAM_API_KEY", "RAGPROXY_ROUTING__SALT_SECRET",
                        "RAGPROXY_UPSTREAMS__LLM"}
    result = check_config(rendered_config(values), tmp_path, env)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["redis"]["url"] is not None
    for secret in ("t0ken-admin", "qdrant-key", "emb-key", "salt-secret", "sk-upstream"):
        assert secret not in result.stdout


def test_misspelt_setting_is_refused(tmp_path: Path) -> None:
    values = values_with(None)
    values["config"]["cache"]["l1"]["max_byte"] = 10
    result = check_config(rendered_config(values), tmp_path)
    assert result.returncode == 2
    assert "cache.l1.max_byte" in result.stderr


def _secret_settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted keys of every SecretStr setting (``[]`` marks a list of sections)."""
    found = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        key = f"{prefix}{name}"
        if typing.get_origin(annotation) is list:
            key, annotation = key + "[]", typing.get_args(annotation)[0]
        for candidate in typing.get_args(annotation) or (annotation,):  # X | None → X, None
            if candidate is SecretStr:
                found.append(key)
            elif isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found += _secret_settings(candidate, key + ".")
    return found


def test_every_secret_setting_has_a_chart_secret() -> None:
    """A new SecretStr setting fails here until the chart can pass it from a Secret (secret.yaml, _env.tpl)."""
    from proxy.assembly.config import Settings

    chart_env = set(SECRET_ENVIRONMENT.values()) | {"RAGPROXY_UPSTREAMS__LLM"}
    env_template = (CHART / "templates" / "_env.tpl").read_text(encoding="utf-8")
    missing = []
    for key in _secret_settings(Settings):
        if key == "upstreams.llm[].api_key":  # secrets.llmApiKeys → llm-upstreams
            continue
        variable = "RAGPROXY_" + key.replace(".", "__").upper()
        if variable not in chart_env or f"name: {variable}" not in env_template:
            missing.append(f"{key} ({variable})")
    assert not missing, missing
    assert "name: RAGPROXY_UPSTREAMS__LLM" in env_template
