"""Calibration evidence kept in a file: what ``ragproxy calibrate --warm`` gathered from an app's logs, read by the
semantic tier when it starts (:meth:`tiers.calibration.Calibrator.seed`).

One JSON object: ``{"version": 1, "namespaces": [{"tenant", "namespace", "observed", "disagreed", "looked"}, ...]}``,
the three lists one count per :data:`~tiers.calibration.GRID` cell. The semantic tier reads at most as many rows as
its calibration budget holds (:attr:`~tiers.calibration.Calibrator.capacity`); a row that is not this shape is
skipped, and a file that is not this shape is refused with :class:`ValueError`.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import orjson

from tiers.calibration import GRID, Evidence

WARM_FILE = "calibration-warm.json"
"""The file's name in the data directory."""
_VERSION = 1


def save(path: Path, rows: dict[tuple[str, str], Evidence]) -> None:
    """Write ``rows`` ((tenant, namespace) → evidence) to ``path``, replacing the rows of those namespaces and
    keeping the others the file held."""
    kept = load(path) if path.exists() else {}
    kept.update(rows)
    data = {"version": _VERSION, "namespaces": [
        {"tenant": tenant, "namespace": namespace, "observed": list(evidence.observed),
         "disagreed": list(evidence.disagreed), "looked": list(evidence.looked)}
        for (tenant, namespace), evidence in sorted(kept.items())]}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(orjson.dumps(data))
    partial.replace(path)


def load(path: Path, max_rows: int | None = None) -> dict[tuple[str, str], Evidence]:
    """The rows of the file at ``path`` (its first ``max_rows``, when given)."""
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a calibration file ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("namespaces"), list):
        raise ValueError(f"{path}: not a calibration file of version {_VERSION}")
    rows: dict[tuple[str, str], Evidence] = {}
    for row in data["namespaces"][:max_rows]:
        evidence = _evidence(row)
        if evidence is not None:
            rows[(row["tenant"], row["namespace"])] = evidence
    return rows


def _evidence(row: object) -> Evidence | None:
    if not isinstance(row, dict) or not all(isinstance(row.get(key), str) for key in ("tenant", "namespace")):
        return None
    lists = [row.get(key) for key in ("observed", "disagreed", "looked")]
    if not all(isinstance(counts, list) and len(counts) == len(GRID)
               and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
               for counts in lists):
        return None
    observed, disagreed, looked = (array("q", counts) for counts in lists)  # type: ignore[arg-type]
    if any(d > o for d, o in zip(disagreed, observed, strict=True)):
        return None
    return Evidence(observed, disagreed, looked)
