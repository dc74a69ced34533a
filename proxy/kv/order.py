"""Document order policies: in what order the retrieved documents go into the prompt.

* ``preserve`` — retrieval order, untouched; the proxy only routes and hints. Output quality is exactly the
app's.
* ``reuse`` (the default) — reorder the documents so the prompt follows the longest path the replica already has cached
  (knowledge tree), so more of the prefill is skipped. The top-ranked document is always kept at an edge of
  the document block (first or last): models use the beginning and the end of a long context best and the
  middle worst ("lost in the middle", Liu et al. 2023), and the top-ranked document is the one most likely to
  hold the answer. Trade-off: the other documents may move into the middle, where they are used less; for
  top-k of 3-5 the effect is small next to a several-fold lower time to first token. The rendered prompt then
  states the retrieval order in one line after the documents (:func:`normalizer.prompt_plan.rank_hint`), so the
  rank stays visible to the model without changing the cached prefix. Namespaces whose
  prompts depend on a specific order (numbered citations that the app maps back by position, chronological
  context) should keep ``preserve``.
* ``shift`` — ``reuse``'s order, and llama.cpp replicas are also asked to reuse cached chunks that are *not* part
  of the common prefix (``n_cache_reuse``: a run of at least ``routing.shift_min_tokens`` matching tokens found
  later in the slot's cached prompt has its KV moved to the new position instead of being recomputed). Documents
  that a cached prompt holds in the same relative order are then reused even after a document the cache lacks.
  ``reuse`` puts the documents it cannot take from the cached path in a canonical order (most popular first),
  so the documents two prompts share tend to appear in the same relative order, which is what the shift finds.
  Trade-off: a shifted document's KV was computed after the documents that preceded it in the *cached* prompt,
  not in this one, so the backend's answer is an approximation of a full prefill (not bit-identical); use it
  where time to first token matters more than exact reproducibility. Only llama.cpp backends honour it; other
  kinds get ``reuse``.

The reuse search is a depth-first walk of the tree below the system prompt, restricted to the request's
documents (at most ``search_budget`` nodes visited), so it costs little even for a wide tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from normalizer.prompt_plan import Segment
from proxy.kv.tree import KnowledgeTree


class OrderPolicy(Enum):
    PRESERVE = "preserve"
    REUSE = "reuse"
    SHIFT = "shift"


class Popularity:
    """How often documents were requested lately: counts decayed with a half-life measured in requests that carry
    documents.

    Pure and bounded (``capacity`` documents; the least popular half is dropped when full). Used by ``reuse`` to
    put the documents it cannot take from the cache in a canonical order (most popular first), so that requests
    sharing popular documents build and then follow the same paths.
    """

    def __init__(self, half_life_requests: float = 1000.0, capacity: int = 100_000) -> None:
        self._growth = 2.0 ** (1.0 / half_life_requests)
        self._weight = 1.0
        self.capacity = capacity
        self._scores: dict[str, float] = {}

    def observe(self, keys: Sequence[str]) -> None:
        self._weight *= self._growth
        for key in keys:
            self._scores[key] = self._scores.get(key, 0.0) + self._weight
        if self._weight > 1e100:
            self._scores = {k: v / self._weight for k, v in self._scores.items()}
            self._weight = 1.0
        if len(self._scores) > self.capacity:
            keep = sorted(self._scores.items(), key=lambda kv: kv[1], reverse=True)[: self.capacity // 2]
            self._scores = dict(keep)

    def score(self, key: str) -> float:
        return self._scores.get(key, 0.0) / self._weight


def order_documents(
    policy: OrderPolicy,
    system: Segment | None,
    ranked: Sequence[Segment],
    tree: KnowledgeTree,
    *,
    popularity: Popularity | None = None,
    search_budget: int = 2048,
) -> list[Segment]:
    """The documents of ``ranked`` (best first) in the order the prompt should carry them.

    ``reuse`` (and ``shift``, which orders the same way) compares candidate orders by the tokens ``tree`` has
    cached for them: the longest cached path of the request's documents (cut before the top-ranked document
    unless it starts the path; the top-ranked document then goes last), the top-ranked document followed by the
    longest cached path below it, and the retrieval order. Documents not on a cached path follow in order of
    ``popularity`` (retrieval order without it). Ties go to the first candidate; with nothing cached and
    ``popularity`` given, the canonical order (the top-ranked document first if it is also the most popular,
    else last) is used.
    """
    docs = list(ranked)
    if policy is OrderPolicy.PRESERVE or len(docs) < 2:
        return docs
    head = [system] if system is not None else []
    head_keys = [s.key for s in head]
    by_key = {d.key: d for d in docs}
    rank = {d.key: i for i, d in enumerate(docs)}
    top = docs[0]

    def cached(order: list[Segment]) -> int:
        return tree.match([*head, *order]).tokens

    def rest(exclude: set[str]) -> list[Segment]:
        remaining = [d for d in docs if d.key not in exclude]
        if popularity is not None:
            remaining.sort(key=lambda d: (-popularity.score(d.key), rank[d.key]))
        return remaining

    candidates: list[list[Segment]] = []
    path = _best_path(tree, head_keys, by_key, search_budget)
    if path:
        if path[0] == top.key:
            candidates.append([by_key[k] for k in path] + rest(set(path)))
        else:
            kept = path[: path.index(top.key)] if top.key in path else path
            candidates.append([by_key[k] for k in kept] + rest({*kept, top.key}) + [top])
    if tree.path_tokens([*head_keys, top.key]) > tree.path_tokens(head_keys):
        allowed = {k: v for k, v in by_key.items() if k != top.key}
        below_top = _best_path(tree, [*head_keys, top.key], allowed, search_budget // 4)
        candidates.append([top] + [by_key[k] for k in below_top] + rest({top.key, *below_top}))
    if popularity is not None:
        others = rest({top.key})
        top_first = popularity.score(top.key) >= popularity.score(others[0].key)
        candidates.append([top, *others] if top_first else [*others, top])
    candidates.append(docs)
    best, best_tokens = candidates[0], cached(candidates[0])
    for candidate in candidates[1:]:
        tokens = cached(candidate)
        if tokens > best_tokens:
            best, best_tokens = candidate, tokens
    if policy is OrderPolicy.SHIFT:
        return _grouped_for_shift(best, head, tree, top)
    return best


def shift_reusable_tokens(tree: KnowledgeTree, path: Sequence[Segment]) -> int:
    """Tokens of ``path`` a llama.cpp server with chunk reuse probably skips: its cached prefix, then the
    documents that follow in the latest prompt through that prefix, in that prompt's order, up to the first one
    it lacks (the server's scan stops there)."""
    match = tree.match(path)
    position = {key: i for i, key in enumerate(tree.recent_continuation([s.key for s in path[:match.segments]]))}
    tokens, last = match.tokens, -1
    for segment in path[match.segments:]:
        found = position.get(segment.key, -1)
        if found <= last:
            break
        tokens, last = tokens + segment.tokens, found
    return tokens


def _grouped_for_shift(order: list[Segment], head: list[Segment], tree: KnowledgeTree, top: Segment) -> list[Segment]:
    """``order`` with the documents after its cached path regrouped for llama.cpp's chunk reuse: first those that
    the latest prompt through that path holds, in that prompt's order, then the others (the top-ranked document
    stays at its edge). The server restores a prompt sharing the longest prefix, then scans it for the next
    document of the new prompt; the scan stops at the first document that prompt lacks."""
    on_path = tree.match([*head, *order]).segments - len(head)
    fixed = max(on_path, 1 if order[0] is top else 0)
    last = [top] if order[-1] is top and fixed < len(order) else []
    movable = order[fixed:len(order) - len(last)]
    recent = tree.recent_continuation([s.key for s in [*head, *order[:fixed]]])
    position = {key: i for i, key in enumerate(recent)}
    held = sorted((d for d in movable if d.key in position), key=lambda d: position[d.key])
    return [*order[:fixed], *held, *(d for d in movable if d.key not in position), *last]


def _best_path(tree: KnowledgeTree, prefix: list[str], allowed: dict[str, Segment], budget: int) -> list[str]:
    """Keys of the allowed documents forming the longest cached path (in tokens) below ``prefix``."""
    best: list[str] = []
    best_tokens = 0
    visits = 0
    stack: list[tuple[list[str], int]] = [([], 0)]
    while stack and visits < budget:
        path, tokens = stack.pop()
        visits += 1
        if tokens > best_tokens:
            best, best_tokens = path, tokens
        used = set(path)
        for key, size in tree.children_of([*prefix, *path], among=allowed):
            if key not in used:
                stack.append(([*path, key], tokens + size))
    return best
