"""Dictionary training in a child process: same result as in-process, and no child outlives its parent."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tiers.cold.train_process import decode_samples, encode_samples, train_in_child
from tiers.compression import train_dictionary

ROOT = Path(__file__).resolve().parents[2]

# A cold store that retrains its dictionary from enough distinct entries that training takes a while.
SLOW_PARENT = """
import asyncio, hashlib, sys
from tiers.cold import ColdStore

async def main(directory):
    store = await ColdStore(directory, train_after=10**9).opened()
    for i in range(400):
        await store.put(f"k{i}", b'{"content":"%s"}' % hashlib.sha256(b"%d" % i).hexdigest().encode() * 40)
    print("training", flush=True)
    await store.retrain_dictionary()

asyncio.run(main(sys.argv[1]))
"""


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_until(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_framing_round_trips_and_drops_a_truncated_tail() -> None:
    samples = [b"", b"a", b"x" * 70_000]
    assert list(decode_samples(encode_samples(samples))) == samples
    assert list(decode_samples(encode_samples(samples)[:-10])) == samples[:2]


async def test_child_trains_the_same_dictionary_as_this_process() -> None:
    samples = [b'{"object":"chat.completion","content":"answer number %d of many"}' % i for i in range(200)]
    assert await train_in_child(samples) == train_dictionary(samples)


async def test_cancelling_the_call_kills_the_child() -> None:
    before = children_of(os.getpid())
    samples = [b"sample %d " % i * 200 for i in range(4000)]
    task = asyncio.ensure_future(train_in_child(samples))
    started = await asyncio.to_thread(wait_until, lambda: children_of(os.getpid()) - before, 10)
    assert started
    child = (children_of(os.getpid()) - before).pop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not alive(child)


def test_a_killed_cold_store_leaves_no_training_process_behind(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", SLOW_PARENT, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "training"
        assert wait_until(lambda: children_of(parent.pid), 10), "the training child never started"
        trainers = children_of(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # The orphan ends at the latest when its training run does (broken pipe on stdout).
        assert wait_until(lambda: not any(alive(pid) for pid in trainers), 60), "training child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
