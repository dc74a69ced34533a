"""A model of an inference engine's prefix KV cache and its parallel slots (pure: no I/O, no clock).

Used by :class:`upstream_doubles.llm_server.FakeLLM` when enabled, and on its own by simulations (routing
benchmark).

Design, and why it is hand-written (no library models an engine's cache):

- Tokens: :func:`tokenize` splits text on whitespace and maps each word to a stable 32-bit id (blake2b).
  Crude, but deterministic and roughly one token per word, which is all a cache model needs.
- Blocks: the prompt is cut into blocks of ``block_size`` tokens; only full blocks are cached (as in vLLM).
  Block *i*'s key is ``blake2b(key(i-1) || tokens of block i)``, a chained hash, so a block only matches when
  the whole prefix before it matches.
- Lookup: the cached prefix is the run of leading blocks present in the cache. At least the last prompt token
  is always recomputed (engines need its logits), so ``cached_tokens <= len(tokens) - 1``.
- LRU over blocks with a capacity in blocks. After a prefill the prompt's blocks are touched from last to
  first, so the first blocks are the most recent: eviction removes prefix tails before their parents and never
  leaves an unreachable child behind (vLLM frees blocks in reverse order for the same reason).
- Prefill time: ``overhead_s + per_token_s * uncached_tokens``.
- Slots: :class:`SlotSchedule` gives ``slots`` parallel servers with a FIFO queue over simulated time; a
  request's time to first token is its queue wait plus its prefill time.
- llama.cpp hints (applied by the server, documented here): ``cache_prompt: false`` skips both lookup and
  insert (the whole prompt is computed and nothing is kept); ``id_slot: k`` pins the request to slot ``k`` (it
  waits for that slot even when another is free). The cache itself is shared by all slots (a vLLM-style prefix
  cache).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

_ROOT = b"\x00" * 16
LLAMA_SERVER_SLOTS = 1
"""Parallel slots of a llama-server started without ``--parallel``: the doubles' default."""


def tokenize(text: str) -> list[int]:
    """Whitespace tokens mapped to stable 32-bit ids."""
    return [
        int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big") for word in text.split()
    ]


def block_keys(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hash keys of the full blocks of ``tokens``."""
    keys: list[bytes] = []
    previous = _ROOT
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = b"".join(t.to_bytes(4, "big") for t in tokens[start : start + block_size])
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        keys.append(previous)
    return keys


class PrefillResult(NamedTuple):
    """What one prefill cost: tokens served from cache, tokens computed, seconds spent."""

    cached: int
    uncached: int
    seconds: float


@dataclass
class KVCacheModel:
    """Block-hashed prefix cache with LRU eviction and a linear prefill-time model.

    Defaults: 16-token blocks, 4096 blocks (65,536 tokens), 0.2 ms per uncached token, 5 ms fixed overhead.
    """

    capacity_blocks: int = 4096
    block_size: int = 16
    per_token_s: float = 0.0002
    overhead_s: float = 0.005
    _blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.capacity_blocks < 0:
            raise ValueError("block_size must be >= 1 and capacity_blocks >= 0")

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` a prefill would take from the cache now (no change to the cache)."""
        hits = 0
        for key in block_keys(tokens, self.block_size):
            if key not in self._blocks:
                break
            hits += 1
        return max(0, min(hits * self.block_size, len(tokens) - 1))

    def prefill_seconds(self, uncached: int) -> float:
        return self.overhead_s + self.per_token_s * uncached

    def estimate(self, tokens: Sequence[int]) -> PrefillResult:
        """What :meth:`prefill` would report, without touching the cache."""
        cached = self.cached_prefix(tokens)
        uncached = len(tokens) - cached
        return PrefillResult(cached, uncached, self.prefill_seconds(uncached))

    def prefill(self, tokens: Sequence[int], *, use_cache: bool = True) -> PrefillResult:
        """Prefill ``tokens``: look up the cached prefix, then keep the prompt's blocks (LRU)."""
        if not use_cache:
            return PrefillResult(0, len(tokens), self.prefill_seconds(len(tokens)))
        result = self.estimate(tokens)
        for key in reversed(block_keys(tokens, self.block_size)):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return result

    def clear(self) -> None:
        self._blocks.clear()


class Admission(NamedTuple):
    """Where and when a request runs in a :class:`SlotSchedule`."""

    slot: int
    start: float
    end: float
    wait: float


@dataclass
class SlotSchedule:
    """``slots`` parallel servers with a FIFO queue, in simulated time (admit requests in arrival order)."""

    slots: int = LLAMA_SERVER_SLOTS
    _free_at: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        self._free_at = [0.0] * self.slots

    def next_start(self, arrival: float, slot: int | None = None) -> float:
        """When a request arriving at ``arrival`` would start (on ``slot``, or the earliest free one)."""
        free = self._free_at[slot] if slot is not None else min(self._free_at)
        return max(arrival, free)

    def admit(self, arrival: float, service_s: float, slot: int | None = None) -> Admission:
        """Book ``service_s`` seconds on ``slot`` (or the earliest free one) for a request arriving then."""
        if slot is None:
            slot = min(range(self.slots), key=lambda i: self._free_at[i])
        elif not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range 0..{self.slots - 1}")
        start = max(arrival, self._free_at[slot])
        end = start + service_s
        self._free_at[slot] = end
        return Admission(slot, start, end, start - arrival)
