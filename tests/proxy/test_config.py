"""Configuration: precedence file < environment < flags, and every invalid input is exit 2 naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxy.assembly.config import ConfigError, load_settings


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.cli", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=60)


def test_defaults_are_embedded_mode() -> None:
    settings = load_settings(env={})
    assert settings.server.port == 8080
    assert settings.upstreams.qdrant.url is None
    assert settings.cache.enabled


def test_precedence(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": 1111, "host": "0.0.0.0"}, "cache": {"l1": {"ttl_s": 5}}}))
    settings = load_settings(config, env={"RAGPROXY_SERVER__PORT": "2222", "RAGPROXY_CACHE__L1__TTL_S": "7"},
                             overrides={"server.port": 3333})
    assert settings.server.port == 3333
    assert settings.server.host == "0.0.0.0"
    assert settings.cache.l1.ttl_s == 7


def test_llm_url_with_v1_suffix_is_normalized() -> None:
    settings = load_settings(env={}, overrides={"upstreams.llm": [{"url": "http://vllm:8000/v1/"}]})
    assert settings.upstreams.llm[0].url == "http://vllm:8000"


def test_secrets_are_masked_by_check_config() -> None:
    result = _cli("check-config", "--set", "admin.token=topsecret",
                  env={"RAGPROXY_UPSTREAMS__QDRANT__API_KEY": "qsecret"})
    assert result.returncode == 0, result.stderr
    assert "topsecret" not in result.stdout and "qsecret" not in result.stdout


@pytest.mark.parametrize(("args", "env", "key"), [
    (["--port", "abc"], {}, "server.port"),
    (["--port", "70000"], {}, "server.port"),
    ([], {"RAGPROXY_SERVER__PORT": "0"}, "server.port"),
    (["--llm-upstream", "ftp://x"], {}, "upstreams.llm.0.url"),
    (["--set", "cache.l1.policy_typo=lru"], {}, "cache.l1.policy_typo"),
    (["--set", "auth.mode=maybe"], {}, "auth.mode"),
    (["--set", "upstreams.read_timeout_s=-1"], {}, "upstreams.read_timeout_s"),
    (["--set", "novalue"], {}, "novalue"),
    ([], {"RAGPROXY_LOGGING__LEVEL": "loud"}, "logging.level"),
    (["--set", "routing.order=shuffle"], {}, "routing.order"),
    (["--set", "routing.shift_min_tokens=0"], {}, "routing.shift_min_tokens"),
])
def test_invalid_config_exits_2_naming_the_key(args: list[str], env: dict[str, str], key: str) -> None:
    result = _cli("check-config", *args, env=env)
    assert result.returncode == 2
    assert key in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_config_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("server: [unclosed")
    for path in (str(broken), str(tmp_path / "missing.yaml")):
        result = _cli("check-config", "--config", path)
        assert result.returncode == 2 and path in result.stderr


def test_config_error_type() -> None:
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_settings(env={"RAGPROXY_SERVER__PORT": "x"})


@pytest.mark.parametrize("url", ["redis+sentinel://:hunter2-secret@h1:26379", "ftp://ops:hunter2-secret@h/x"])
def test_a_rejected_url_never_shows_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(overrides={"redis.url": url})
    assert "redis.url" in str(error.value) and "hunter2" not in str(error.value)


def test_the_configurable_backend_kinds_are_the_registered_adapters() -> None:
    from proxy.kv.kinds import KINDS
    from proxy.upstream.settings import BACKEND_KINDS

    assert sorted(BACKEND_KINDS) == sorted(KINDS)


def test_a_config_file_error_names_its_line_and_column(tmp_path: Path) -> None:
    """A YAML syntax error, and a value the settings refuse, say where in the file they are."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("server:\n  port: 80\n   host: x\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column 8 \(mapping values are not allowed"):
        load_settings(broken, env={})
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("server:\n  host: 0.0.0.0\n  port: eighty\ncache:\n  l1: {ttl_s: -5}\n")
    with pytest.raises(ConfigError, match=r"^server\.port = 'eighty': .* \(wrong\.yaml line 3, column 9\)$"):
        load_settings(wrong, env={})
    with pytest.raises(ConfigError, match=r"\(environment variable RAGPROXY_SERVER__PORT\)$"):
        load_settings(wrong, env={"RAGPROXY_SERVER__PORT": "x"})
    wrong.write_text("server:\n  port: 8080\ncache:\n  l1: {ttl_s: -5}\n")
    with pytest.raises(ConfigError, match=r"^cache\.l1\.ttl_s = -5: .* \(wrong\.yaml line 4, column 15\)$"):
        load_settings(wrong, env={})
    with pytest.raises(ConfigError) as named:
        load_settings(wrong, env={}, overrides={"cache.l1.ttl_s": -1})
    assert "line" not in str(named.value), "a value from the command line needs no place"
