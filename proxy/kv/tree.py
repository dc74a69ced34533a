"""Knowledge tree: what one backend replica's KV cache probably holds, as a prefix tree of prompt segments.

A prompt is a sequence of segments ``[system prompt, D1, D2, ...]``, each a :class:`Segment` (a stable key — a
hash of the system prompt, a doc id — and its size in tokens). The tree stores the sequences sent to the
replica; a path from the root is a prefix the replica has computed. The total of the nodes' tokens is kept
within ``capacity_tokens`` (what the replica's KV cache holds, configured or read from the backend) by
evicting the leaf with the lowest PGDSF priority (RAGCache's prefix-aware Greedy-Dual-Size-Frequency)::

    priority = clock + frequency * cost / size

``cost`` is the node's recompute time behind its cached prefix (:meth:`PrefillModel.marginal_seconds`),
``size`` its tokens, ``frequency`` how often a request used it, and ``clock`` the GDSF inflation value: the
priority of the last evicted node, so that what was popular long ago ages out. Only leaves are evicted (a KV
prefix cache cannot keep a suffix without its prefix). The path of the sequence being inserted is never
evicted by that insert: the replica has just computed it.

The mirror drifts from the truth (other clients, the backend's own eviction policy), so :meth:`correct` takes
what the backend reported as cached for a request (``usage.prompt_tokens_details.cached_tokens``, llama.cpp
``timings.cache_n``, converted by the caller into the tree's token estimates): a shortfall against the
prediction drops the nodes the backend did not have and, when the tree was full (``full_fraction`` of its
capacity), shrinks the capacity estimate — a shortfall in a tree far below capacity is the backend's own doing
(llama.cpp overwriting a slot, another client), not a sign of a smaller cache; a surplus grows the capacity
(within ``[min_capacity_tokens, max_capacity_tokens]``).

Pure: no I/O; the wall clock (used for recency tie-breaks) is injected.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from normalizer.prompt_plan import Segment
from proxy.kv.prefill import PrefillModel


@dataclass(eq=False, slots=True)
class _Node:
    key: str
    tokens: int
    parent: _Node | None
    depth_tokens: int
    """Tokens from the root up to and including this node."""
    children: dict[str, _Node] = field(default_factory=dict)
    frequency: int = 0
    priority: float = 0.0
    last_access: float = 0.0
    version: int = 0
    alive: bool = True
    pending: int = 0
    """Requests in flight that compute this node (sent, not answered yet)."""


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class Match:
    """The cached part of a sequence: its length in segments and tokens."""

    segments: int
    tokens: int


class KnowledgeTree:
    """Prefix tree mirroring one replica's KV cache, with PGDSF eviction."""

    def __init__(
        self,
        capacity_tokens: int,
        *,
        prefill: PrefillModel | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_capacity_tokens: int | None = None,
        max_capacity_tokens: int | None = None,
        shrink_factor: float = 0.9,
        grow_factor: float = 1.05,
        tolerance_tokens: int = 32,
        full_fraction: float = 0.9,
    ) -> None:
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens must be positive")
        self.capacity_tokens = capacity_tokens
        self.min_capacity_tokens = min_capacity_tokens or max(1, capacity_tokens // 8)
        self.max_capacity_tokens = max_capacity_tokens or capacity_tokens * 4
        self.shrink_factor = shrink_factor
        self.grow_factor = grow_factor
        self.tolerance_tokens = tolerance_tokens
        """How far a report may fall short of the prediction and still confirm it: the tree counts no chat-template
        tokens, so a report converted by the whole prompt's ratio comes out short of a wholly reused path by about
        the template's tokens (17-20 on llama.cpp with a Llama-style template, measured under ``bench kv_load``);
        a document is hundreds."""
        self.full_fraction = full_fraction
        self.prefill = prefill or PrefillModel()
        self._clock = clock
        self._root = _Node(key="", tokens=0, parent=None, depth_tokens=0)
        self._heap: list[tuple[float, float, int, _Node, int]] = []
        self._tie = itertools.count()
        self.gdsf_clock = 0.0
        self.size_tokens = 0
        self.node_count = 0
        self.evictions = 0
        self.forgotten_tokens = 0
        """Tokens dropped because the replica lost them (:meth:`forget`, and shortfalls in :meth:`correct`)."""

    # --- queries -------------------------------------------------------------------------------------------

    def match(self, seq: Sequence[Segment]) -> Match:
        """Longest cached prefix of ``seq``, in segments and in the tree's token sizes.

        Segments match by key alone: keys are content hashes, so the sizes recorded at insertion stand. A node
        that requests in flight are still computing is not cached yet: the match stops before it (a llama.cpp
        slot cannot reuse what another slot is computing).
        """
        node = self._root
        segments = 0
        for segment in seq:
            child = node.children.get(segment.key)
            if child is None or child.pending:
                break
            node = child
            segments += 1
        return Match(segments, node.depth_tokens)

    def children_of(self, keys: Sequence[str], among: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """``(key, tokens)`` of the children below the path ``keys`` (empty when the path is not cached).

        With ``among``, only those keys are looked up (cost independent of the tree's width).
        """
        node: _Node | None = self._root
        for key in keys:
            node = node.children.get(key) if node else None
            if node is None:
                return []
        assert node is not None
        if among is None:
            return [(c.key, c.tokens) for c in node.children.values()]
        children = node.children
        return [(k, children[k].tokens) for k in among if k in children]

    def path_tokens(self, keys: Sequence[str]) -> int:
        """Tokens along the cached path ``keys`` (stops at the first key not cached)."""
        node = self._root
        for key in keys:
            child = node.children.get(key)
            if child is None:
                break
            node = child
        return node.depth_tokens

    def recent_continuation(self, keys: Sequence[str]) -> list[str]:
        """Keys below the cached path ``keys``, taking the most recently used child at each step: the rest of the
        latest prompt sent through that prefix (empty when the path is not cached or ends at a leaf)."""
        node: _Node | None = self._root
        for key in keys:
            node = node.children.get(key) if node else None
        continuation: list[str] = []
        while node is not None and node.children:
            node = max(node.children.values(), key=lambda child: child.last_access)
            continuation.append(node.key)
        return continuation

    def reuse_value(self, seq: Sequence[Segment]) -> float:
        """How much later requests reused the prefixes of ``seq`` beyond its first segment (the system prompt
        every prompt shares): the largest ``(frequency - 1) * tokens`` over them, 0 for a one-off prompt."""
        node = self._root
        value = 0.0
        for depth, segment in enumerate(seq):
            child = node.children.get(segment.key)
            if child is None:
                break
            node = child
            if depth:
                value = max(value, (node.frequency - 1) * node.depth_tokens)
        return value

    def frequency(self, keys: Sequence[str]) -> int:
        node: _Node | None = self._root
        for key in keys:
            node = node.children.get(key) if node else None
        return node.frequency if node else 0

    # --- updates -------------------------------------------------------------------------------------------

    def insert(self, seq: Sequence[Segment], *, in_flight: bool = False) -> Match:
        """Record that ``seq`` was sent to the replica; returns what was cached before (the prediction). With
        ``in_flight`` the nodes beyond it are being computed until :meth:`settled` (or :meth:`retract`) with that
        prediction, and no match counts them meanwhile."""
        if not seq:
            return Match(0, 0)
        before = self.match(seq)
        now = self._clock()
        node = self._root
        path: list[_Node] = []
        for index, segment in enumerate(seq):
            child = node.children.get(segment.key)
            if child is None:
                child = _Node(
                    key=segment.key,
                    tokens=segment.tokens,
                    parent=node,
                    depth_tokens=node.depth_tokens + segment.tokens,
                )
                node.children[segment.key] = child
                self.size_tokens += segment.tokens
                self.node_count += 1
            child.frequency += 1
            if in_flight and index >= before.segments:
                child.pending += 1
            child.last_access = now
            self._reprioritize(child)
            path.append(child)
            node = child
        self._evict(pinned=set(map(id, path)))
        return before

    def retract(self, seq: Sequence[Segment], predicted: Match) -> None:
        """Undo the :meth:`insert` of a request that was never sent (refused after routing).

        ``predicted`` is what that insert returned: nodes beyond it were created by the insert and go again
        unless a later request used them too; the frequencies it added are taken back.
        """
        path: list[_Node] = []
        node = self._root
        for segment in seq:
            child = node.children.get(segment.key)
            if child is None:
                break
            path.append(child)
            node = child
        for index in range(len(path) - 1, -1, -1):
            child = path[index]
            child.frequency = max(0, child.frequency - 1)
            if index >= predicted.segments:
                child.pending = max(0, child.pending - 1)
            if index >= predicted.segments and child.frequency == 0 and not child.children:
                self._remove_subtree(child)
            else:
                self._reprioritize(child)

    def settled(self, seq: Sequence[Segment], predicted: Match) -> None:
        """The request that :meth:`insert` returned ``predicted`` for is over: what it computed is cached now
        (even if other requests in flight compute it too)."""
        node = self._root
        for index, segment in enumerate(seq):
            child = node.children.get(segment.key)
            if child is None:
                return
            if index >= predicted.segments:
                child.pending = 0
            node = child

    def correct(
        self, seq: Sequence[Segment], cached_tokens_reported: int, predicted: Match | None = None
    ) -> None:
        """Align the mirror with what the replica reported as cached for ``seq``.

        ``predicted`` is what :meth:`insert` returned for the request; without it only the capacity surplus
        case (the backend had more than the tree) can be recognised.
        """
        predicted_tokens = predicted.tokens if predicted else 0
        reported = max(0, cached_tokens_reported)
        if reported + self.tolerance_tokens < predicted_tokens:
            if self.size_tokens >= self.full_fraction * self.capacity_tokens:
                self.capacity_tokens = max(
                    self.min_capacity_tokens, int(self.capacity_tokens * self.shrink_factor)
                )
            self._drop_other_branches(seq, reported)
            self._evict(pinned=self._path_ids(seq))
        elif reported > predicted_tokens + self.tolerance_tokens:
            self.capacity_tokens = min(
                self.max_capacity_tokens, int(self.capacity_tokens * self.grow_factor) + 1
            )

    def forget(self, seq: Sequence[Segment], kept_tokens: int) -> None:
        """The replica no longer holds ``seq`` beyond its first ``kept_tokens``: drop the first node past them and
        what hangs below it (computed behind that node, so gone with it)."""
        node = self._root
        for segment in seq:
            child = node.children.get(segment.key)
            if child is None:
                return
            if child.depth_tokens > kept_tokens:
                self._forget_subtree(child)
                return
            node = child

    def clear(self) -> None:
        for child in list(self._root.children.values()):
            self._remove_subtree(child)
        self._heap.clear()

    # --- internals -----------------------------------------------------------------------------------------

    def _path_ids(self, seq: Sequence[Segment]) -> set[int]:
        ids: set[int] = set()
        node = self._root
        for segment in seq:
            child = node.children.get(segment.key)
            if child is None:
                break
            ids.add(id(child))
            node = child
        return ids

    def _drop_other_branches(self, seq: Sequence[Segment], reported: int) -> None:
        """The backend lost what lay beyond ``reported`` tokens on this path: drop what hung below it.

        The path itself was recomputed by this request and stays; every other branch below the first node the
        backend did not have was computed behind that lost prefix, so it is gone as well.
        """
        node = self._root
        lost = False
        for index, segment in enumerate(seq):
            child = node.children.get(segment.key)
            if child is None:
                return
            lost = lost or child.depth_tokens > reported + self.tolerance_tokens
            if lost:
                following = seq[index + 1].key if index + 1 < len(seq) else None
                for key, grandchild in list(child.children.items()):
                    if key != following:
                        self._forget_subtree(grandchild)
            node = child

    def _cost(self, node: _Node) -> float:
        prefix = node.depth_tokens - node.tokens
        return self.prefill.marginal_seconds(node.tokens, prefix)

    def _reprioritize(self, node: _Node) -> None:
        size = max(1, node.tokens)
        node.priority = self.gdsf_clock + node.frequency * self._cost(node) / size * 1000.0
        node.version += 1
        heapq.heappush(self._heap, (node.priority, node.last_access, next(self._tie), node, node.version))
        if len(self._heap) > 4 * self.node_count + 64:
            self._heap = [e for e in self._heap if e[3].alive and e[4] == e[3].version]
            heapq.heapify(self._heap)

    def _evict(self, pinned: set[int]) -> None:
        deferred: list[tuple[float, float, int, _Node, int]] = []
        while self.size_tokens > self.capacity_tokens and self._heap:
            entry = heapq.heappop(self._heap)
            _, _, _, node, version = entry
            if not node.alive or version != node.version:
                continue
            if node.children or id(node) in pinned:
                deferred.append(entry)
                continue
            self.gdsf_clock = max(self.gdsf_clock, node.priority)
            self._remove_subtree(node)
            self.evictions += 1
            parent = node.parent
            if parent is not None and parent is not self._root and not parent.children:
                parent.version += 1
                heapq.heappush(
                    self._heap, (parent.priority, parent.last_access, next(self._tie), parent, parent.version)
                )
        for entry in deferred:
            heapq.heappush(self._heap, entry)

    def _forget_subtree(self, node: _Node) -> None:
        before = self.size_tokens
        self._remove_subtree(node)
        self.forgotten_tokens += before - self.size_tokens

    def _remove_subtree(self, node: _Node) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            stack.extend(current.children.values())
            current.alive = False
            self.size_tokens -= current.tokens
            self.node_count -= 1
        if node.parent is not None:
            node.parent.children.pop(node.key, None)
