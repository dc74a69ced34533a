"""Runtime configuration changes: which keys may change without a restart, and how a change is applied.

A patch is a JSON object of dotted keys (``{"cache.expose_key": true}``) or the same keys nested
(``{"cache": {"expose_key": true}}``). Only :data:`PATCHABLE` keys are accepted: the ones every component reads
per request or that the pipelines are rebuilt from. The new value is validated by building a whole new
:class:`~proxy.config.Settings` (same rules and messages as at start-up); then ``rt.settings`` is replaced and the
pipelines rebuilt (request handlers look their pipeline up per request, so the next request uses the new one;
requests in flight finish on the old one). The logging level is applied to the root logger at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from proxy.config import Settings

PATCHABLE: tuple[str, ...] = (
    "cache.l1.ttl_s",
    "cache.cache_sampled",
    "cache.unknown_fields",
    "cache.coalesce_wait_s",
    "cache.expose_key",
    "cache.shared_namespaces",
    "logging.level",
    "logging.access_log",
)


class PatchRejected(ValueError):
    """A patch naming a key that cannot change at run time, or an invalid value."""


def flatten(patch: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects → dotted keys (stopping at patchable keys, whose values may be lists)."""
    flat: dict[str, Any] = {}
    for name, value in patch.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping) and dotted not in PATCHABLE:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def patched(settings: Settings, patch: Mapping[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """New settings with ``patch`` applied and the flat changes; :class:`PatchRejected` when not allowed."""
    changes = flatten(patch)
    if not changes:
        raise PatchRejected("the patch is empty; patchable keys: " + ", ".join(PATCHABLE))
    refused = sorted(key for key in changes if key not in PATCHABLE)
    if refused:
        raise PatchRejected(f"{refused[0]}: cannot change without a restart; patchable keys: "
                            + ", ".join(PATCHABLE))
    data = settings.model_dump()
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    try:
        return Settings.model_validate(data), changes
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"])
        raise PatchRejected(f"{key} = {error.get('input')!r}: {error['msg']}") from None


def apply_logging(settings: Settings) -> None:
    logging.getLogger().setLevel(settings.logging.level.upper())
