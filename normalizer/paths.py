"""The front door's path rules: one reading of a request path, shared by the proxy and every upstream.

The data plane routes on the percent-decoded path and forwards the path as the client sent it. Both are safe only
when every server on the way reads the path the same way, so a path that servers are known to read differently is
refused before routing (400 ``bad_path``), for every route:

* dot segments (``/./``, ``/../``, a trailing ``/.``): aiohttp-, Express- and nginx-fronted servers resolve them
  (RFC 3986 §5.2.4), so ``/v1/x/../chat/completions`` would reach the upstream's chat route past the proxy's;
* repeated slashes (``//``): merged by nginx and others;
* percent-encoded dots, slashes and backslashes (``%2e``, ``%2f``, ``%5c``, any case), and backslashes: decoded
  or turned into separators by some servers and not by others;
* control characters once decoded (``%00``, ``%0a``, ...).

Refusing rather than normalising keeps one rule: what goes upstream is byte for byte the path the proxy routed
on. No client library sends such paths for the APIs the proxy serves.

:class:`PathAllowList` is the operator's list of other LLM API requests the generic pass-through forwards
(``upstreams.llm_passthrough``): ``"METHOD /path"`` patterns whose ``*`` segments match one path segment each.
"""

from __future__ import annotations

import re

_SUSPECT = re.compile(r"//|/\.|\\|%")
_ENCODED = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(raw_path: str, path: str) -> str | None:
    """Why ``raw_path`` (as sent, query included) and its decoded ``path`` may be read differently upstream, or
    ``None`` when there is one reading (see the module docstring)."""
    raw = raw_path.partition("?")[0]
    if not _SUSPECT.search(raw):
        return None
    if "\\" in raw:
        return "backslashes are not allowed in paths"
    if _ENCODED.search(raw):
        return "percent-encoded dots, slashes and backslashes are not allowed in paths"
    if "//" in raw:
        return "repeated slashes are not allowed in paths"
    if any(segment in (".", "..") for segment in raw.split("/")):
        return "dot segments (. and ..) are not allowed in paths"
    if _CONTROL.search(path):
        return "control characters are not allowed in paths"
    return None


class PathAllowList:
    """The requests an operator allows through the generic pass-through: ``"METHOD /path"`` patterns (see the
    module docstring); a pattern's ``*`` segment matches exactly one non-empty segment."""

    def __init__(self, patterns: list[str]) -> None:
        self._patterns: list[tuple[str, tuple[str, ...]]] = []
        for pattern in patterns:
            method, _, path = pattern.strip().partition(" ")
            self._patterns.append((method.upper(), tuple(path.strip().split("/"))))

    def allows(self, method: str, path: str) -> bool:
        segments = path.split("/")
        return any(
            allowed_method in (method, "*") and len(allowed) == len(segments)
            and all(want == got or (want == "*" and got) for want, got in zip(allowed, segments, strict=True))
            for allowed_method, allowed in self._patterns
        )


def check_pattern(pattern: str) -> str:
    """``pattern`` if it is a valid ``"METHOD /path"`` pass-through pattern, else a :class:`ValueError`."""
    method, _, path = pattern.strip().partition(" ")
    path = path.strip()
    if not method or not re.fullmatch(r"[A-Za-z]+|\*", method):
        raise ValueError(f"{pattern!r}: expected 'METHOD /path' (e.g. 'GET /v1/models/*')")
    if not path.startswith("/v1/") or path_problem(path, path) is not None or " " in path:
        raise ValueError(f"{pattern!r}: the path must start with /v1/ and have no dot segments, '//' or '%'")
    return f"{method.upper()} {path}"
