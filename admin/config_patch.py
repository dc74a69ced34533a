"""Runtime configuration changes: which keys may change without a restart, and how a patch is validated.

A patch is a JSON object of dotted keys (``{"cache.expose_key": true}``) or the same keys nested
(``{"cache": {"expose_key": true}}``). Only the live keys (:data:`proxy.assembly.live_settings.LIVE_KEYS`) are accepted.
The new values are validated by building a whole new :class:`~proxy.assembly.config.Settings` (same rules and messages
as
at start-up); the route then hands the new settings to the runtime, whose owners of the changed keys apply them in
place — nothing is rebuilt. What a change means for requests in flight is said in :mod:`proxy.assembly.live_settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from proxy.assembly.config import Settings
from proxy.assembly.live_settings import LIVE_KEYS


class PatchRejected(ValueError):
    """A patch naming a key that cannot change at run time, or an invalid value."""


def flatten(patch: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects → dotted keys (stopping at patchable keys, whose values may be lists)."""
    flat: dict[str, Any] = {}
    for name, value in patch.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping) and dotted not in LIVE_KEYS:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def patched(settings: Settings, patch: Mapping[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """New settings with ``patch`` applied and the flat changes; :class:`PatchRejected` when not allowed."""
    changes = flatten(patch)
    if not changes:
        raise PatchRejected("the patch is empty; patchable keys: " + ", ".join(LIVE_KEYS))
    refused = sorted(key for key in changes if key not in LIVE_KEYS)
    if refused:
        raise PatchRejected(f"{refused[0]}: cannot change without a restart; patchable keys: "
                            + ", ".join(LIVE_KEYS))
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
