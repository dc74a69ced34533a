"""Per-request cache control: every directive, their combinations, precedence and errors."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from normalizer.cache_control import (
    CacheControlError,
    CacheDefaults,
    CachePolicy,
    cache_policy,
    split_proxy_fields,
)

DEFAULTS = CacheDefaults(ttl=3600.0, max_ttl=86400.0, namespace="default")


def policy(headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> CachePolicy:
    return cache_policy(headers or {}, body, DEFAULTS)


# (case, headers, body, may_read, may_store, max_age, ttl, namespace, force_refresh)
Row = tuple[str, dict[str, str], dict[str, Any] | None, bool, bool, float | None, float | None, str, bool]
TABLE: list[Row] = [
    ("nothing", {}, None, True, True, None, 3600, "default", False),
    ("no-cache", {"Cache-Control": "no-cache"}, None, False, True, None, 3600, "default", True),
    ("no-store", {"Cache-Control": "no-store"}, None, True, False, None, 3600, "default", False),
    (
        "no-cache, no-store",
        {"cache-control": "no-cache, no-store"},
        None,
        False,
        False,
        None,
        3600,
        "default",
        False,
    ),
    ("max-age", {"Cache-Control": "max-age=60"}, None, True, True, 60, 3600, "default", False),
    ("max-age=0 is a refresh", {"Cache-Control": "max-age=0"}, None, False, True, 0, 3600, "default", True),
    ("quoted max-age", {"Cache-Control": 'max-age="60"'}, None, True, True, 60, 3600, "default", False),
    ("s-maxage sets ttl", {"Cache-Control": "s-maxage=120"}, None, True, True, None, 120, "default", False),
    (
        "unknown directive ignored",
        {"Cache-Control": "private, max-age=5"},
        None,
        True,
        True,
        5,
        3600,
        "default",
        False,
    ),
    ("x-ragproxy-ttl", {"X-Ragproxy-TTL": "30.5"}, None, True, True, None, 30.5, "default", False),
    ("ttl capped", {"x-ragproxy-ttl": "999999"}, None, True, True, None, 86400, "default", False),
    ("ttl 0 means no store", {"x-ragproxy-ttl": "0"}, None, True, False, None, 0, "default", False),
    ("namespace header", {"x-ragproxy-namespace": "docs-v2"}, None, True, True, None, 3600, "docs-v2", False),
    (
        "portkey refresh",
        {"x-portkey-cache-force-refresh": "true"},
        None,
        False,
        True,
        None,
        3600,
        "default",
        True,
    ),
    (
        "portkey false",
        {"x-portkey-cache-force-refresh": "false"},
        None,
        True,
        True,
        None,
        3600,
        "default",
        False,
    ),
    ("cf skip", {"cf-aig-skip-cache": "true"}, None, False, False, None, 3600, "default", False),
    ("cf ttl", {"cf-aig-cache-ttl": "90"}, None, True, True, None, 90, "default", False),
    ("pragma", {"Pragma": "no-cache"}, None, False, True, None, 3600, "default", True),
    (
        "pragma ignored with cache-control",
        {"Pragma": "no-cache", "Cache-Control": "max-age=9"},
        None,
        True,
        True,
        9,
        3600,
        "default",
        False,
    ),
    ("empty header ignored", {"x-ragproxy-ttl": " "}, None, True, True, None, 3600, "default", False),
    ("litellm ttl", {}, {"cache": {"ttl": 300}}, True, True, None, 300, "default", False),
    (
        "litellm s-maxage is a read limit",
        {},
        {"cache": {"s-maxage": 10}},
        True,
        True,
        10,
        3600,
        "default",
        False,
    ),
    ("litellm no-cache", {}, {"cache": {"no-cache": True}}, False, True, None, 3600, "default", True),
    ("litellm no-store", {}, {"cache": {"no-store": True}}, True, False, None, 3600, "default", False),
    (
        "litellm false flags",
        {},
        {"cache": {"no-cache": False, "no-store": False}},
        True,
        True,
        None,
        3600,
        "default",
        False,
    ),
    ("litellm namespace", {}, {"cache": {"namespace": "team.a"}}, True, True, None, 3600, "team.a", False),
    (
        "litellm unknown key ignored",
        {},
        {"cache": {"use-cache": True}},
        True,
        True,
        None,
        3600,
        "default",
        False,
    ),
    (
        "ragproxy body",
        {},
        {"ragproxy": {"ttl": 5, "max_age": 2, "no_store": True}},
        True,
        False,
        2,
        5,
        "default",
        False,
    ),
    # precedence: the most restrictive wins, whatever the source
    (
        "smallest ttl wins",
        {"Cache-Control": "s-maxage=50", "x-ragproxy-ttl": "20"},
        {"cache": {"ttl": 40}},
        True,
        True,
        None,
        20,
        "default",
        False,
    ),
    (
        "smallest max-age wins",
        {"Cache-Control": "max-age=50"},
        {"cache": {"s-maxage": 7}},
        True,
        True,
        7,
        3600,
        "default",
        False,
    ),
    (
        "any no-store wins",
        {"Cache-Control": "max-age=5"},
        {"cache": {"no-store": True}},
        True,
        False,
        5,
        3600,
        "default",
        False,
    ),
    (
        "refresh + skip = bypass",
        {"x-portkey-cache-force-refresh": "1", "cf-aig-skip-cache": "yes"},
        None,
        False,
        False,
        None,
        3600,
        "default",
        False,
    ),
    (
        "agreeing namespaces",
        {"x-ragproxy-namespace": "a"},
        {"cache": {"namespace": "a"}},
        True,
        True,
        None,
        3600,
        "a",
        False,
    ),
]


@pytest.mark.parametrize(
    ("case", "headers", "body", "may_read", "may_store", "max_age", "ttl", "namespace", "force_refresh"),
    TABLE,
    ids=[row[0] for row in TABLE],
)
def test_policy_table(
    case: str,
    headers: dict[str, str],
    body: dict[str, Any] | None,
    may_read: bool,
    may_store: bool,
    max_age: float | None,
    ttl: float | None,
    namespace: str,
    force_refresh: bool,
) -> None:
    result = policy(headers, body)
    assert (
        result.may_read,
        result.may_store,
        result.max_age,
        result.ttl,
        result.namespace,
        result.force_refresh,
    ) == (
        may_read,
        may_store,
        max_age,
        ttl,
        namespace,
        force_refresh,
    )
    assert (result.reason is None) == (may_read and may_store)


ERRORS: list[tuple[str, dict[str, str], dict[str, Any] | None, str]] = [
    ("max-age not a number", {"Cache-Control": "max-age=abc"}, None, "max-age"),
    ("max-age negative", {"Cache-Control": "max-age=-1"}, None, "max-age"),
    ("max-age without value", {"Cache-Control": "max-age"}, None, "max-age"),
    ("s-maxage decimal", {"Cache-Control": "s-maxage=1.5"}, None, "s-maxage"),
    ("negative ttl header", {"x-ragproxy-ttl": "-5"}, None, "x-ragproxy-ttl"),
    ("cf ttl garbage", {"cf-aig-cache-ttl": "soon"}, None, "cf-aig-cache-ttl"),
    ("illegal namespace chars", {"x-ragproxy-namespace": "a/b"}, None, "namespace"),
    ("namespace too long", {"x-ragproxy-namespace": "a" * 65}, None, "namespace"),
    ("namespace starting with dot", {"x-ragproxy-namespace": ".hidden"}, None, "namespace"),
    ("flag not boolean", {"cf-aig-skip-cache": "maybe"}, None, "cf-aig-skip-cache"),
    ("negative body ttl", {}, {"cache": {"ttl": -1}}, "cache.ttl"),
    ("string body ttl", {}, {"cache": {"ttl": "60"}}, "cache.ttl"),
    ("body flag not boolean", {}, {"cache": {"no-cache": "yes"}}, "cache.no-cache"),
    ("body namespace illegal", {}, {"cache": {"namespace": "a b"}}, "cache.namespace"),
    ("cache not an object", {}, {"cache": True}, "cache"),
    ("ragproxy unknown key", {}, {"ragproxy": {"tll": 5}}, "tll"),
    ("conflicting namespaces", {"x-ragproxy-namespace": "a"}, {"cache": {"namespace": "b"}}, "conflicting"),
]


@pytest.mark.parametrize(("case", "headers", "body", "mentions"), ERRORS, ids=[row[0] for row in ERRORS])
def test_invalid_values_raise_a_clear_error(
    case: str, headers: dict[str, str], body: dict[str, Any] | None, mentions: str
) -> None:
    with pytest.raises(CacheControlError, match=mentions) as error:
        policy(headers, body)
    assert isinstance(error.value, ValueError)


def test_repeated_headers_in_a_multidict_are_combined() -> None:
    headers = CIMultiDict([("Cache-Control", "no-store"), ("cache-control", "max-age=3")])
    result = cache_policy(headers, None, DEFAULTS)
    assert (result.may_store, result.max_age) == (False, 3)


def test_configuration_disables_everything() -> None:
    result = cache_policy({"Cache-Control": "max-age=5"}, None, CacheDefaults(enabled=False))
    assert (result.may_read, result.may_store, result.force_refresh) == (False, False, False)
    assert result.reason == "caching disabled by configuration"


def test_defaults_without_ttl_or_cap() -> None:
    result = cache_policy({}, None, CacheDefaults(ttl=None, max_ttl=None))
    assert result.ttl is None
    assert cache_policy({"x-ragproxy-ttl": "7"}, None, CacheDefaults(ttl=None)).ttl == 7


def test_split_proxy_fields() -> None:
    body = {"model": "m", "cache": {"ttl": 1}, "ragproxy": {}, "messages": []}
    stripped, lifted = split_proxy_fields(body)
    assert stripped == {"model": "m", "messages": []}
    assert lifted == {"cache": {"ttl": 1}, "ragproxy": {}}
    assert "cache" in body  # the original is left alone
    plain = {"model": "m"}
    assert split_proxy_fields(plain) == (plain, {}) and split_proxy_fields(plain)[0] is plain
