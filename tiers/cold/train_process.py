"""Dictionary training in a short-lived child process (``python -m tiers.cold.train_process``).

Training is seconds of pure-Python CPU; in the serving process it would hold the GIL and stall the event loop.
The child reads the samples on stdin (each a 4-byte big-endian length, then the bytes) and writes the dictionary
on stdout.

A plain child with pipes rather than a ``ProcessPoolExecutor``: a pool worker whose parent is killed (SIGKILL,
OOM) waits on its call queue forever, while this child sees the end of stdin, or a broken pipe on stdout, and
exits. Nothing outlives the process that asked for the dictionary by more than one training run.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from collections.abc import Iterable, Iterator

from tiers.compression import train_dictionary

_LENGTH = struct.Struct(">I")


def encode_samples(samples: Iterable[bytes]) -> bytes:
    """The samples framed for the child's stdin."""
    return b"".join(_LENGTH.pack(len(sample)) + sample for sample in samples)


def decode_samples(data: bytes) -> Iterator[bytes]:
    """The samples back from :func:`encode_samples`; a truncated tail (the parent died mid-write) is dropped."""
    offset = 0
    while offset + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            return
        yield data[offset:offset + length]
        offset += length


async def train_in_child(samples: list[bytes]) -> bytes:
    """The dictionary :func:`~tiers.compression.train_dictionary` builds from ``samples``, computed in a child
    process. Cancelling the call kills the child. Raises ``RuntimeError`` when the child fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        dictionary, error = await process.communicate(encode_samples(samples))
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    if process.returncode != 0:
        last = error.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {process.returncode}"]
        raise RuntimeError(f"dictionary training failed: {last[0]}")
    return dictionary


def main() -> int:
    samples = decode_samples(sys.stdin.buffer.read())
    try:
        sys.stdout.buffer.write(train_dictionary(samples))
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the parent is gone: nobody wants the result
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
