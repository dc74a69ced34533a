"""The one start-up summary of ``ragproxy serve``: where it listens, its upstreams (each probed once), which tiers
are on and why one is off, where its data lives, the admin URL and whether it needs a token.

It takes the form of the logs (:func:`announce`): where they are plain text (``logging.format=text``, or ``auto``
and stderr a terminal) a plain block on stderr; where they are JSON, one log record carrying the same facts under
``startup``. JSON logs usually go to a collector that parses every line of stderr, where a plain block would arrive
as a dozen broken records. The
facts are gathered by :func:`gather` (the only I/O: one probe per upstream) and shaped by pure functions.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.metadata
import logging
import sys
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from proxy.assembly.config import Settings
from proxy.assembly.runtime import Runtime
from proxy.cache_tiers.semantic import SemanticCacheTier
from proxy.observability.logs import plain
from proxy.upstream.backends import HEALTH_PATH, Backend
from proxy.upstream.client import UpstreamClient
from proxy.upstream.http1 import ConnectFailed
from proxy.upstream.settings import QdrantUpstream, redact_url
from tiers.semantic import SemanticTier

log = logging.getLogger("ragproxy")

PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Upstream:
    role: str  # "LLM (<kind>)" or "Qdrant"
    url: str | None  # without credentials; None: not configured
    state: str  # "reachable, models: ..." or "unreachable: connection refused"


@dataclass(frozen=True)
class StartupReport:
    version: str
    data_plane: str
    admin: str
    upstreams: list[Upstream]
    features: dict[str, str]  # tier or layer → "on: ..." or "off: why"
    data_dir: str

    def record(self) -> dict[str, Any]:
        """The facts as one JSON-ready object (the ``startup`` field of the log record)."""
        return asdict(self)


def version() -> str:
    try:
        return importlib.metadata.version("ragproxy")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def admin_line(settings: Settings) -> str:
    admin = settings.admin
    if not admin.enabled:
        return "off: admin.enabled is off"
    access = "token required (Authorization: Bearer <admin.token>)" if admin.token is not None \
        else "no token needed: loopback only"
    return f"{http_url(admin.host, admin.port)}/admin/ui  ({access})"


def data_plane_line(settings: Settings) -> str:
    base = http_url(settings.server.host, settings.server.port)
    everywhere = "  (all interfaces)" if settings.server.host in ("0.0.0.0", "::", "") else ""
    qdrant = f", Qdrant URL {base}" if settings.upstreams.qdrant.url else ""
    return f"{base}{everywhere}  (OpenAI base URL {base}/v1{qdrant})"


TIER_LABELS = {"l1": "L1 exact", "l2": "L2 semantic", "l3": "L3 cold", "retrieval": "search cache"}


def _tier_detail(name: str, settings: Settings, shared: bool) -> str:
    cache = settings.cache
    details = {
        "l1": "shared in Redis, near copies in memory" if shared else f"in memory, up to {_size(cache.l1.max_bytes)}",
        "l3": f"{settings.data_dir.resolve() / 'cold'}, up to {_size(cache.l3.max_bytes)}",
        "retrieval": "" if settings.upstreams.qdrant.url else "idle until a Qdrant upstream is configured",
    }
    return details.get(name, "")


def l2_line(settings: Settings, warming: bool) -> str:
    """Whether L2 serves hits now and, if not, what it waits for: its embedding model (``warming``: still loading)
    and, calibrated, each namespace's own checks of its hits (none are served before them)."""
    l2 = settings.cache.l2
    rate = f"{l2.max_wrong_hit_rate:.0%}"
    if l2.threshold is not None:
        serves = f"hits at threshold {l2.threshold:g}"
    elif l2.namespace_thresholds:
        names = sorted(l2.namespace_thresholds)
        fixed = ", ".join(names) if len(names) <= 3 else f"{len(names)} namespaces"
        serves = f"hits in {fixed}; others once checks bound wrong hits under {rate}"
    else:
        serves = f"no hits until checks bound a namespace's wrong hits under {rate}"
    state = "on" if l2.threshold is not None else "calibrating"
    return f"warming up: model loading, then {serves}" if warming else f"{state}: {serves}"


def calibration_line(semantic: SemanticTier) -> str | None:
    """How far L2's calibration has come (``None`` under one fixed threshold): the namespaces started from
    ``ragproxy calibrate --warm`` with where each stands, else how many agreeing comparisons a new one needs."""
    calibrator = semantic.calibrator
    if calibrator.fixed is not None:
        return None
    warmed = [name for name, point in calibrator.points().items() if "/" in name and point.observations]
    if not warmed:
        fresh = semantic.progress.of("default", "")
        about = f"about {fresh.needs} agreeing comparisons" if fresh.needs is not None else "comparisons"
        return (f"a namespace serves after {about} of cached and fresh answers; "
                "ragproxy calibrate --warm LOG.jsonl starts one from an app's logs")
    shown = []
    for name in warmed[:2]:
        tenant, _, namespace = name.rpartition("/")
        shown.append(f"{name}: {semantic.progress.of(namespace, tenant).summary()}")
    more = f" (+{len(warmed) - 2} more)" if len(warmed) > 2 else ""
    return "; ".join(shown) + more


def describe_features(settings: Settings, runtime: Runtime) -> dict[str, str]:
    """Each cache tier and layer: ``on: what it runs on``, or ``off: why``; L2 as :func:`l2_line` says, and how far
    its calibration has come (:func:`calibration_line`)."""
    warming = any(isinstance(tier, SemanticCacheTier) and tier.warming for tier in runtime.tiers)
    shared = runtime.shared is not None
    states = {tier.name: l2_line(settings, warming) if tier.name == "l2"
              else f"on: {detail}" if (detail := _tier_detail(tier.name, settings, shared)) else "on"
              for tier in runtime.tiers}
    states.update({off.name: f"off: {off.reason}" for off in runtime.tiers.off})
    order = [*TIER_LABELS, *sorted(set(states) - set(TIER_LABELS))]
    features = {TIER_LABELS.get(name, name): states[name] for name in order if name in states}
    semantic = next((tier.semantic for tier in runtime.tiers if isinstance(tier, SemanticCacheTier)), None)
    if semantic is not None and (progress := calibration_line(semantic)) is not None:
        features["L2 calibration"] = progress
    features["KV routing"] = "on" if settings.routing.enabled else "off: routing.enabled is off"
    features["credits"] = "on" if settings.credits.enabled else "off: credits.enabled is off"
    features["auth"] = "keys: Authorization: Bearer <API key> required" if settings.auth.mode == "keys" \
        else "open: one anonymous tenant, no API keys"
    return features


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"


async def probe(client: UpstreamClient, url: str, headers: dict[str, str]) -> tuple[str, Any]:
    """``(state, parsed JSON body or None)`` of one GET, never raising."""
    try:
        answer = await client.fetch("GET", url, headers=headers, timeout_s=PROBE_TIMEOUT_S)
    except TimeoutError:
        return f"unreachable: no answer within {PROBE_TIMEOUT_S:g} s", None
    except ConnectFailed as exc:
        return f"unreachable: {'connection refused' if exc.errno == errno.ECONNREFUSED else exc.strerror}", None
    except (OSError, ValueError) as exc:
        return f"unreachable: {exc.__class__.__name__}", None
    if answer.status != 200:
        return f"reachable, but answers HTTP {answer.status}", None
    try:
        return "reachable", answer.json()
    except ValueError:
        return "reachable", None


def _models(body: Any) -> list[str]:
    """The model ids of a ``/v1/models`` answer."""
    data = body.get("data") if isinstance(body, dict) else None
    return [str(item.get("id")) for item in data if isinstance(item, dict)] if isinstance(data, list) else []


async def _llm(client: UpstreamClient, backend: Backend) -> Upstream:
    state, body = await probe(client, backend.url + HEALTH_PATH, backend.auth_headers())
    models = _models(body)
    if models:
        state += f", models: {', '.join(models[:3])}{' ...' if len(models) > 3 else ''}"
    return Upstream(f"LLM ({backend.config.kind})", backend.label, state)


async def _qdrant(client: UpstreamClient, qdrant: QdrantUpstream) -> Upstream:
    if qdrant.url is None:
        return Upstream("Qdrant", None, "not configured (--qdrant-upstream URL); Qdrant routes answer 502")
    headers = {"api-key": qdrant.api_key.get_secret_value()} if qdrant.api_key else {}
    state, body = await probe(client, qdrant.url + "/", headers)  # Qdrant's root names its version
    release = body.get("version") if isinstance(body, dict) else None
    return Upstream("Qdrant", redact_url(qdrant.url), f"{state}, Qdrant {release}" if release else state)


async def gather(settings: Settings, runtime: Runtime) -> StartupReport:
    """Probe every upstream once (concurrently) and put the report together."""
    client = runtime.client
    upstreams = await asyncio.gather(*(_llm(client, backend) for backend in runtime.backends.backends),
                                     _qdrant(client, settings.upstreams.qdrant))
    return StartupReport(version=version(), data_plane=data_plane_line(settings), admin=admin_line(settings),
                         upstreams=list(upstreams), features=describe_features(settings, runtime),
                         data_dir=str(settings.data_dir.resolve()))


def render(report: StartupReport) -> str:
    """The plain-text block."""
    rows = [("data plane", report.data_plane), ("admin", report.admin),
            *((up.role, f"{up.url}  {up.state}" if up.url else up.state) for up in report.upstreams),
            *report.features.items(), ("data", report.data_dir)]
    width = max(len(label) for label, _ in rows)
    lines = [f"ragproxy {report.version} ready", *(f"  {label:<{width}}  {value}" for label, value in rows)]
    return "\n".join(lines) + "\n"


def announce(report: StartupReport, log_format: str, stream: TextIO | None = None) -> None:
    """Write the report for whoever reads stderr (see the module docstring)."""
    out = stream or sys.stderr
    if plain(log_format, out):
        out.write(render(report))
        out.flush()
    else:
        log.info("ragproxy %s ready on %s", report.version, report.data_plane.split()[0],
                 extra={"startup": report.record()})
