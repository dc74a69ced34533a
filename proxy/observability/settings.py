"""The ``telemetry`` and ``logging`` settings sections. Composed into :class:`proxy.assembly.config.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.core.settings_section import Section


class TelemetrySettings(Section):
    tracing: bool = Field(default=False, description="OpenTelemetry spans per request and pipeline stage")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP traces endpoint, e.g. http://otel:4318/v1/traces")
    service_name: str = Field(default="ragproxy", description="service.name resource attribute")


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Minimum level logged")
    format: Literal["auto", "json", "text"] = Field(
        default="auto", description="Log line format; auto: plain text when stderr is a terminal, else JSON")
    access_log: bool = Field(default=False, description="One structured line per data-plane request")
