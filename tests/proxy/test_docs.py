"""Documentation that is generated must be current."""

from __future__ import annotations

from pathlib import Path

from proxy.config_reference import reference

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference(), "run: python -m proxy.config_reference > docs/configuration.md"
