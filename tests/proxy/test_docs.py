"""Documentation that is generated must be current."""

from __future__ import annotations

from pathlib import Path

from proxy.assembly.config import Settings
from proxy.assembly.config_reference import reference

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference(), "run: python -m proxy.assembly.config_reference > docs/configuration.md"


def _tuning_row(key: str) -> list[str]:
    """The cells of the row of ``key`` in docs/operations.md's tuning table."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    [row] = [line for line in text.splitlines() if line.startswith(f"| `{key}`")]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_tuning_table_states_the_settings_model_s_semantic_defaults() -> None:
    """operations.md said the L2 threshold defaulted to 0.80 while the model calibrates it (no fixed threshold)."""
    l2 = Settings().cache.l2
    assert l2.threshold is None and "none" in _tuning_row("cache.l2.threshold")[1]
    assert str(l2.max_wrong_hit_rate) in _tuning_row("cache.l2.max_wrong_hit_rate")[1]
    assert [guard.strip() for guard in _tuning_row("cache.l2.guards")[1].split(",")] == l2.guards
