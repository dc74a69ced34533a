"""Documents recognised because they repeat across requests: the blank-line paragraphs of prompts that move.

An app that joins its retrieved chunks with blank lines only (``"\\n\\n".join(texts)``) gives a prompt no shape
:mod:`normalizer.prompt_blocks` can read: a paragraph of one chunk cannot be told from the next chunk. What tells them
apart is time. The app's own text (instructions, headers, question templates) sits in the same place in every prompt,
between the same neighbours; a retrieved chunk comes back in other requests, at other ranks, beside other chunks.

:class:`RepeatedBlocks` observes, request after request, the paragraphs of a long message (split at blank lines) and
says which count as documents. A paragraph of at least :data:`~normalizer.prompt_blocks.MIN_WORDS` words counts once
it has been seen, across requests,

- between at least two different neighbours on each side (a neighbour is the paragraph before or after it, or the
  message's start or end): the app's fixed text always meets the same neighbour on at least one side;
- at two different distances (in paragraphs) from the message's start and two from its end: fixed text between a
  variable part and a fixed one (an instruction between the chunks and the question) keeps its distance to the
  fixed side.

A chunk of several paragraphs is therefore not recognised (each of its paragraphs always meets the next one), nor is
a chunk that always comes first. The caller (:func:`normalizer.documents.read_prompt`) adds the paragraphs that count
to the :class:`~normalizer.documents.DocumentRegistry`, which then finds them in any later prompt exactly as it finds
the texts Qdrant searches returned through the proxy: spans, KV reordering and evidence follow from there.

Budget: only hashes are kept (Python's per-process ``hash`` of the paragraph's exact text, salted at start-up so a
client cannot aim collisions): per paragraph the first neighbour seen on each side and the first distance from each
edge, each replaced by a mark once a different one is seen; a paragraph that counts keeps only its key. At most
``max_bytes // ENTRY_BYTES`` paragraphs, least recently seen leave first. Texts are held only by the registry, under
its own budget, and only for paragraphs that count. A message of more than :data:`MAX_PARAGRAPHS` paragraphs (a
pasted book, not a handful of chunks) is not observed.

Harmless when wrong: a paragraph of the app's own text counts only if it comes back word for word beside other
neighbours, at other distances from both edges. If one does, the most the proxy does with it is what it does with
any recognised document: route by it, permute it as a whole block among the message's documents (``routing.order``
``reuse``, the default, or ``shift``; never edited), cut it out of the question the semantic tier compares and of
the context signature, and weigh it as evidence. The semantic tier serves no answer through it that its calibration
does not measure: an answer rests on the paragraph only if the paragraph holds the answer's content, a prompt that
adds a paragraph restating the answer's figures or words is vetoed (:mod:`normalizer.evidence`), and every other
candidate the evidence lets through is one the calibration's comparisons judge, each pitting the cached answer
against the fresh answer the upstream gives to the new prompt, with its own text, so what a misread paragraph
changes counts against the namespace's wrong-share bound like a question needing another answer (docs/semantic.md,
"Why the bound still holds"). Recognition changes over time as the registry's does: a paragraph counts from the
request that completes its evidence, and stops once the registry has dropped its text and this learner its count, so
the same prompt may be read as plain one day and with documents another, as with searches through the proxy.

Cost: a message under :data:`~normalizer.prompt_blocks.FEWEST_WORDS` words is never split (the caller's guard). A
user message of a header, 5 chunks of 150 words, rules and a question, its chunks counting:
:meth:`~RepeatedBlocks.observe` 9-20 µs, 32-48 µs with the re-registering of the 5 chunks (all that ``read_prompt``
adds), against 300-400 µs for ``read_prompt`` itself (2 shared cores at load average 9, 2026-12-02; ``PYTHONPATH=.
python loadtest/repeated_blocks_cost.py``).
"""

from __future__ import annotations

from collections import OrderedDict

from normalizer.prompt_blocks import BLANK_LINE, MIN_WORDS

ENTRY_BYTES = 240
"""What one observed paragraph is charged: its key, its four marks and its place in the LRU (``tracemalloc`` measured
187-213 bytes per paragraph seen once, the most one holds, with 6,000 to 132,000 of them)."""
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
"""About 140,000 paragraphs: a chunk is recognised when it comes back within some 20,000 requests bringing 7 new
paragraphs each."""
MAX_PARAGRAPHS = 256
"""A message with more paragraphs is not observed."""

_START, _END = 0, 1
"""The message's edges as neighbours (a paragraph's hash is either with probability 2**-63)."""


class _Seen:
    """What one paragraph has met: the first neighbour on each side and its first distance from each edge, each
    ``None`` once a different one was seen."""

    __slots__ = ("after", "before", "from_end", "from_start")

    def __init__(self, before: int, after: int, from_start: int, from_end: int) -> None:
        self.before: int | None = before
        self.after: int | None = after
        self.from_start: int | None = from_start
        self.from_end: int | None = from_end

    def meet(self, before: int, after: int, from_start: int, from_end: int) -> bool:
        """Record one sighting; whether the paragraph now counts."""
        if self.before != before:
            self.before = None
        if self.after != after:
            self.after = None
        if self.from_start != from_start:
            self.from_start = None
        if self.from_end != from_end:
            self.from_end = None
        return self.before is None and self.after is None and self.from_start is None and self.from_end is None


class RepeatedBlocks:
    """Paragraphs seen in long messages, and which of them have moved enough to count as documents."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < ENTRY_BYTES:
            raise ValueError(f"max_bytes must be at least {ENTRY_BYTES}")
        self.max_bytes = max_bytes
        self.capacity = max_bytes // ENTRY_BYTES
        self.evicted = 0
        self._seen: OrderedDict[int, _Seen | None] = OrderedDict()
        """Paragraph hash → what it has met; ``None`` once it counts (its key alone is kept)."""

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def bytes(self) -> int:
        return len(self._seen) * ENTRY_BYTES

    def observe(self, text: str) -> list[str]:
        """Record the paragraphs of one message's ``text``; those that count as documents (each stripped, in order,
        including those that counted before)."""
        paragraphs = [p for p in (piece.strip() for piece in BLANK_LINE.split(text)) if p]
        if not 2 <= len(paragraphs) <= MAX_PARAGRAPHS:
            return []
        keys = [hash(p) for p in paragraphs]
        last = len(paragraphs) - 1
        seen = self._seen
        counting: list[str] = []
        for index, paragraph in enumerate(paragraphs):
            if len(paragraph.split(None, MIN_WORDS - 1)) < MIN_WORDS:
                continue
            key = keys[index]
            before = keys[index - 1] if index else _START
            after = keys[index + 1] if index < last else _END
            if key not in seen:
                seen[key] = _Seen(before, after, index, last - index)
                if len(seen) > self.capacity:
                    seen.popitem(last=False)
                    self.evicted += 1
                continue
            seen.move_to_end(key)
            entry = seen[key]
            if entry is None or entry.meet(before, after, index, last - index):
                seen[key] = None
                counting.append(paragraph)
        return counting
