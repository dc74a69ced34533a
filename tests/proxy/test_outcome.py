"""The outcome on the way back: typed statuses, and the charge handed to the metrics as a number."""

from __future__ import annotations

import ast
from pathlib import Path

import proxy
from proxy.context import RequestContext
from proxy.metrics import Metrics
from proxy.observe import record_metrics
from proxy.outcome import CacheStatus
from proxy.server.request import Request


def _ctx() -> RequestContext:
    return RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat", request_id="r",
                          stream=True)


def test_the_charge_reaches_the_metrics_as_a_number_not_through_the_header() -> None:
    metrics = Metrics()
    observe = record_metrics(metrics)
    ctx = _ctx()
    ctx.charged = 1_234_567
    observe(ctx, 200, 0.01)
    ctx = _ctx()
    ctx.cache_status, ctx.cache_tier, ctx.charged = CacheStatus.HIT, "l1", 0
    observe(ctx, 200, 0.01)
    assert metrics.registry.get_sample_value("ragproxy_credits_charged_total", {"kind": "upstream"}) == 1.234567
    assert metrics.registry.get_sample_value("ragproxy_credits_charged_total", {"kind": "hit"}) == 0.0
    exposition = metrics.exposition().decode()
    assert 'cache_status="HIT"' in exposition and 'cache_status="NONE"' in exposition


def test_statuses_are_their_wire_values() -> None:
    assert [str(status) for status in CacheStatus] == [
        "HIT", "SEMANTIC_HIT", "MISS", "REFRESH", "BYPASS", "STALE", "ERROR", "NONE"]
    assert all(status == status.value and f"{status}" == status.value for status in CacheStatus)


def test_no_bare_status_string_is_left_in_the_proxy() -> None:
    """Statuses are written, compared and reported as :class:`CacheStatus` members (``proxy.outcome`` alone spells
    them out)."""
    root = Path(proxy.__file__).parent
    values = {status.value for status in CacheStatus}
    bare = [f"{path.relative_to(root)}:{node.lineno} {node.value!r}"
            for path in sorted(root.rglob("*.py")) if path.name != "outcome.py"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value in values]
    assert not bare, bare
