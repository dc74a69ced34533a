"""Live settings (``proxy.assembly.live_settings``): every live key has an owner among the assembled parts, and
configuring
them in place leaves each stage as a fresh assembly from the new settings would have built it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from admin.config_patch import patched
from proxy.assembly.config import Settings, load_settings
from proxy.assembly.live_settings import LIVE_KEYS, LiveSettings
from proxy.assembly.pipelines import Pipelines, build_pipelines
from proxy.assembly.runtime import Runtime

PATCHES: list[dict[str, Any]] = [
    {"cache.l1.ttl_s": 5.0},
    {"cache.cache_sampled": False},
    {"cache.unknown_fields": "ignore"},
    {"cache.coalesce_wait_s": 0.25},
    {"cache.expose_key": True},
    {"cache.shared_namespaces": ["faq", "docs"]},
    {"cache.unknown_fields": "ignore", "cache.expose_key": True, "cache.coalesce_wait_s": 2.0},
]


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Every cache stage assembled: answers, per-item caches, stale-if-error."""
    return load_settings(env={}, overrides={"data_dir": str(tmp_path), "cache.l2.enabled": False,
                                            "cache.stale.namespaces": ["stale"], **overrides})


def _plain(value: object) -> bool:
    """A value a stage decides by (not a component it holds): scalars, collections of them, and the normalizer's
    settings objects."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_plain(item) for item in value)
    return dataclasses.is_dataclass(value) and type(value).__module__.startswith("normalizer.")


def _state(part: object) -> dict[str, Any]:
    """What a part decides by: its plain values, and the state of the live parts it holds."""
    state: dict[str, Any] = {}
    for name, value in vars(part).items():
        if _plain(value):
            state[name] = value
        elif hasattr(value, "live_keys"):
            state[name] = _state(value)
    return state


def _stages(pipelines: Pipelines) -> list[tuple[str, str, dict[str, Any]]]:
    return [(name, stage.name, _state(stage)) for name, pipeline in pipelines.by_route().items()
            for stage in pipeline.stages]


def test_every_live_key_has_an_owner(tmp_path: Path) -> None:
    rt = Runtime(_settings(tmp_path))
    build_pipelines(rt)
    assert {key: len(rt.live.owning(key)) > 0 for key in LIVE_KEYS} == dict.fromkeys(LIVE_KEYS, True)


def test_an_owner_of_a_setting_that_is_not_live_is_refused() -> None:
    class Port:
        live_keys = frozenset({"server.port"})

        def configure(self, settings: Settings) -> None:
            raise AssertionError("never configured")

    with pytest.raises(ValueError, match=r"Port claims settings that are not live: \['server.port'\]"):
        LiveSettings().register(Port())


@pytest.mark.parametrize("patch", PATCHES, ids=[",".join(patch) for patch in PATCHES])
def test_configured_stages_are_what_a_fresh_assembly_builds(patch: dict[str, Any], tmp_path: Path) -> None:
    before = _settings(tmp_path / "before")
    rt = Runtime(before)
    pipelines = build_pipelines(rt)
    after, changes = patched(before, patch)
    assert _stages(pipelines) != _stages(build_pipelines(Runtime(after))), "the patch changes some stage"
    rt.configure(after, changes)
    assert rt.settings is after
    assert _stages(pipelines) == _stages(build_pipelines(Runtime(after)))


def test_owners_of_unchanged_keys_are_left_alone(tmp_path: Path) -> None:
    rt = Runtime(_settings(tmp_path))
    build_pipelines(rt)
    seen: list[str] = []

    class Spy:
        live_keys = frozenset({"cache.expose_key"})

        def configure(self, settings: Settings) -> None:
            seen.append("expose_key")

    rt.live.register(Spy())
    rt.configure(*patched(rt.settings, {"cache.coalesce_wait_s": 1.0}))
    assert seen == []
    rt.configure(*patched(rt.settings, {"cache.expose_key": True}))
    assert seen == ["expose_key"]
