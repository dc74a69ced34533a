"""The one typed configuration object, and how it is built.

Sources, lowest precedence first: built-in defaults (embedded mode: no Redis, no Qdrant needed), a YAML file
(``--config``), ``RAGPROXY_*`` environment variables, command-line flags. A nested key ``a.b.c`` is written
``RAGPROXY_A__B__C`` in the environment and ``--set a.b.c=VALUE`` on the command line; values from the environment
and ``--set`` are parsed as YAML scalars/flow collections, so ``8080``, ``true``, ``[a, b]`` and JSON all work.

An invalid value raises :class:`ConfigError` naming the key, the value and what is allowed; the CLI turns it into a
one-line message and exit code 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from normalizer.limits import RequestLimits
from proxy.answers.settings import CacheSettings
from proxy.auth.settings import AuthSettings
from proxy.core.loopback import LOOPBACK, is_loopback
from proxy.core.redis_settings import RedisSettings
from proxy.core.settings_section import Section
from proxy.credits.settings import CreditsSettings
from proxy.idempotency.settings import IdempotencySettings
from proxy.kv.settings import RoutingSettings
from proxy.observability.settings import LoggingSettings, TelemetrySettings
from proxy.server.connection import BODY_TIMEOUT_S, HEAD_TIMEOUT_S, MAX_CONNECTIONS, READ_TIMEOUT_S
from proxy.upstream.settings import Upstreams, redact_url

ENV_PREFIX = "RAGPROXY_"
_LIMITS = RequestLimits()  # the request limits' defaults, defined once there


class ConfigError(ValueError):
    """A configuration value that cannot be used."""


class Server(Section):
    host: str = Field(default=LOOPBACK, description="Data-plane bind address")
    port: int = Field(default=8080, ge=1, le=65535, description="Data-plane port")
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="Largest request body accepted")
    read_timeout_s: float = Field(
        default=READ_TIMEOUT_S, gt=0,
        description="Longest silence from a client in the middle of sending a request (then 408)"
    )
    head_timeout_s: float = Field(
        default=HEAD_TIMEOUT_S, gt=0,
        description="Longest time to receive a whole request head, however steadily it trickles in (then 408); a "
        "new connection's first head counts from the connect"
    )
    body_timeout_s: float = Field(
        default=BODY_TIMEOUT_S, gt=0,
        description="Longest time to receive a whole request body after its head, however steadily it trickles in "
        "(then 408): max_body_bytes needs 280 KB/s"
    )
    max_connections: int = Field(
        default=MAX_CONNECTIONS, ge=1,
        description="Client connections per process, at most 3/4 of the open-file limit; past it the connection "
        "idle the longest is closed"
    )
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="Drain time for in-flight requests on SIGTERM")
    trust_forwarded: bool = Field(default=False, description="Keep incoming X-Forwarded-* chains")


class LimitsSettings(Section):
    json_depth: int = Field(
        default=_LIMITS.json_depth, ge=2, le=255,
        description="Deepest nesting of a JSON request body, 400 beyond (Qdrant's JSON parser refuses more than 128 "
        "levels; the proxy re-encodes at most 255)")
    embedding_inputs: int = Field(
        default=_LIMITS.embedding_inputs, ge=1, description="Items in one embeddings input, 413 beyond (OpenAI's "
        "limit)")
    search_batch: int = Field(
        default=_LIMITS.search_batch, ge=1, description="Searches in one Qdrant batch request, 413 beyond")
    prefetch_depth: int = Field(
        default=_LIMITS.prefetch_depth, ge=1, description="Nesting of prefetch in a Qdrant query, 400 beyond (Qdrant's "
        "own limit)")
    rerank_documents: int = Field(
        default=_LIMITS.rerank_documents, ge=1, description="Documents in one rerank or score request, 413 beyond "
        "(Cohere's limit)")


class AdminSettings(Section):
    enabled: bool = True
    host: str = LOOPBACK
    port: int = Field(default=8081, ge=1, le=65535)
    token: SecretStr | None = Field(default=None, description="Bearer token; required unless bound to loopback")

    def bind_problem(self) -> str | None:
        """Why the admin API must not start with these settings (``serve`` and ``check-config`` refuse them), or
        ``None``."""
        if self.enabled and self.token is None and not is_loopback(self.host):
            return (f"admin API on {self.host}:{self.port} without admin.token: set admin.token "
                    "(RAGPROXY_ADMIN__TOKEN) or bind admin.host to 127.0.0.1")
        return None


class Settings(Section):
    """Everything ragproxy can be told."""

    server: Server = Field(default_factory=Server)
    upstreams: Upstreams = Field(default_factory=Upstreams)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    credits: CreditsSettings = Field(default_factory=CreditsSettings)
    idempotency: IdempotencySettings = Field(default_factory=IdempotencySettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    data_dir: Path = Field(default=Path("./ragproxy-data"), description="Where embedded stores keep their files")

    @model_validator(mode="after")
    def _complete(self) -> Settings:
        if self.credits.store == "redis" and self.redis.url is None:
            raise ValueError("credits.store is redis but redis.url is not set")
        if self.admin.enabled and self.admin.port == self.server.port and _same_address(self.admin.host,
                                                                                         self.server.host):
            raise ValueError(f"admin.port {self.admin.port} is server.port too; the admin API needs a port of its own")
        return self


def _same_address(one: str, other: str) -> bool:
    """Whether two bind addresses can collide on one port (the same, or either listens on every address)."""
    return one == other or {one, other} & {"0.0.0.0", "::", ""} != set()


def load_settings(
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge file < environment < overrides and validate."""
    merged: dict[str, Any] = {}
    where: dict[tuple[str, ...], str] = {}
    if config_file is not None:
        data, where = _read_yaml(Path(config_file))
        _deep_merge(merged, data)
    env = os.environ if env is None else env
    for name, raw in env.items():
        if name.startswith(ENV_PREFIX) and name != ENV_PREFIX + "CONFIG":
            path = name[len(ENV_PREFIX):].lower().split("__")
            _set_path(merged, path, _parse_scalar(raw, ".".join(path)))
            where[tuple(path)] = f"environment variable {name}"
    for dotted, value in (overrides or {}).items():
        _set_path(merged, dotted.split("."), value)
        where[tuple(dotted.split("."))] = ""  # named on the command line: no need to say where
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, merged) + _origin(exc, where)) from None


def parse_assignment(text: str) -> tuple[str, Any]:
    """``a.b=VALUE`` → (``a.b``, parsed VALUE)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. server.port=9000")
    return key.strip(), _parse_scalar(raw, key.strip())


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective configuration as plain data, secrets masked (also passwords inside URLs)."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact_url(value)
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, list):
            return [clean(item) for item in value]
        return value

    return dict(clean(settings.model_dump(mode="json", by_alias=True)))


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The file's settings, and where each key path was written (``config.yaml line 3, column 9``); a syntax error
    names its line and column."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {name!r}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {name!r}: not valid YAML{at}" + (f" ({problem})" if problem else "")) \
            from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {name!r}: the top level must be a mapping of sections")
    where: dict[tuple[str, ...], str] = {}
    _positions(node, (), f"{path.name} line {{line}}, column {{column}}", where)
    return data, where


def _positions(node: yaml.Node | None, path: tuple[str, ...], template: str,
               into: dict[tuple[str, ...], str]) -> None:
    """Where each key path of a YAML mapping's value starts (lines and columns counted from 1)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            step = (*path, str(key.value))
            mark = value.start_mark
            into[step] = template.format(line=mark.line + 1, column=mark.column + 1)
            _positions(value, step, template, into)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            step = (*path, str(index))
            mark = item.start_mark
            into[step] = template.format(line=mark.line + 1, column=mark.column + 1)
            _positions(item, step, template, into)


def _origin(exc: ValidationError, where: Mapping[tuple[str, ...], str]) -> str:
    """`` (where the rejected value was written)``, the nearest key path set in the file, environment or flags."""
    loc = tuple(str(part) for part in exc.errors()[0]["loc"])
    for end in range(len(loc), 0, -1):
        if loc[:end] in where:
            return f" ({where[loc[:end]]})" if where[loc[:end]] else ""
    return ""


def _parse_scalar(raw: str, key: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        raise ConfigError(f"{key} = {raw!r}: not a valid value") from None


def _deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = {}
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _set_path(into: dict[str, Any], path: list[str], value: Any) -> None:
    node = into
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


def _describe(exc: ValidationError, merged: Mapping[str, Any]) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown setting (check the spelling; see `ragproxy check-config` for all keys)"
    allowed = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error" and isinstance(error.get("input"), Mapping):  # a rule across a section
        return f"{key}: {allowed}" if key else allowed
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        allowed = f"allowed: {ctx['expected']}"
    return f"{key} = {_redact(key, error.get('input'))!r}: {redact_url(str(allowed))}"


_SECRET_KEYS = ("key", "secret", "token", "password")


def _redact(key: str, value: Any) -> Any:
    """A rejected value as the error may show it: secrets masked, credentials inside URLs masked."""
    if not isinstance(value, str):
        return value
    if any(word in key.rsplit(".", 1)[-1].lower() for word in _SECRET_KEYS):
        return "***"
    return redact_url(value)
