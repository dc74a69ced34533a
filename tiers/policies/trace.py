"""Cache traces: the request streams the policy simulator replays, as JSON lines ``{key, size, cost, time}``.

``size`` is the bytes a cached entry occupies, ``cost`` what a miss on it costs (the proxy records upstream
seconds), ``time`` when it happened (seconds). :class:`TraceRecorder` appends records in this format (the proxy's
``cache.trace_file`` option); :func:`read_trace` reads them back for ``ragproxy simulate``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One cache lookup: key, bytes its entry occupies, what a miss costs, when it happened (seconds)."""

    key: str
    size: int
    cost: float
    time: float


def read_trace(path: str | Path) -> Iterator[TraceRecord]:
    """Records from a JSON-lines file (blank lines skipped)."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                yield TraceRecord(str(record["key"]), int(record["size"]), float(record["cost"]),
                                  float(record["time"]))


def write_trace(path: str | Path, records: Iterable[TraceRecord]) -> None:
    with TraceRecorder(path) as recorder:
        for record in records:
            recorder.record(record.key, record.size, record.cost, record.time)


def working_set_bytes(records: Iterable[TraceRecord]) -> int:
    """Bytes needed to hold every distinct key once (its first-seen size)."""
    sizes: dict[str, int] = {}
    for record in records:
        sizes.setdefault(record.key, record.size)
    return sum(sizes.values())


class TraceRecorder:
    """Appends ``{key, size, cost, time}`` lines to a trace file; the file opens on the first record.

    Each record is one ``write`` of one line followed by a flush, so a trace read while it is being recorded
    only ever misses the last line, and several recorders may append to one file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    def record(self, key: str, size: int, cost: float, time: float) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._file.write(json.dumps(asdict(TraceRecord(key, size, cost, time)), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
