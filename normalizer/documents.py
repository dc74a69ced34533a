"""Documents in prompts: structured rendering and detection of known documents inside prompt text.

Two ways for the proxy to know which retrieved documents a chat prompt carries:

**Structured mode.** The client sends the documents apart from the prompt, in one of two shapes:

* a body field ``"ragproxy": {"documents": [{"id"?: str, "text": str, "title"?: str}, ...]}`` — documents in
  retrieval order, best first; or
* content parts of a message, ``{"type": "document", "text": str, "id"?: str, "title"?: str}``, mixed with the
  ordinary ``{"type": "text", ...}`` parts (in retrieval order, best first).

The proxy removes them from the body and renders them into the system message with :func:`render`, so the
prompt prefix is ``system prompt, D1, D2, ...`` and the question comes after. The template is byte-stable: a
document's block depends only on the document (its id, title and text), never on its position or on its
neighbours, so the same document always produces the same bytes (and, for a given tokenizer, almost always the
same tokens; each block starts and ends on a newline so that token merges rarely cross a block boundary)::

    <system prompt>\\n\\n
    <document id="ID" title="TITLE">\\nTEXT\\n</document>\\n      (one per document, in the chosen order)

A document without an ``id`` gets :func:`content_id` of its text.

**Recognition from the prompt's structure.** Numbered passages, tagged and delimited blocks pasted into a message
(:mod:`normalizer.prompt_blocks`, which says what is recognised and how a false recognition is kept harmless),
with no search through the proxy: each block's id is :func:`content_id` of its text. Documents joined by blank lines
only are recognised once they have moved between requests (:mod:`normalizer.repeated_blocks`, which adds them to the
registry below).

**Detection.** A :class:`DocumentRegistry` is fed with the payload texts that Qdrant searches returned through
the proxy (doc id = :func:`content_id`), bounded to the most recent ``capacity`` documents and ``max_bytes``
(estimated memory, :func:`entry_bytes`; least recently added or detected leave first).
:meth:`detect` finds registered documents inside any prompt text, in order of appearance; :meth:`spans` also
gives their character spans so that a caller can reorder documents in place (keeping the app's own separators
where they are).

Detection design (word anchors, written here rather than taken from a library): documents and prompts are
compared as sequences of whitespace-separated words, so re-wrapped or re-indented text still matches. Each
document is indexed by a hash of its first ``anchor_words`` words; a scan looks up each window of that many
words in the prompt (one dict lookup per word, skipped unless the word starts some document) and confirms a
candidate by comparing the whole word sequence. Cost is linear in the prompt and independent of the registry's
size. Measured on this (shared, loaded) machine, a 5-document prompt of 1,661 words against 2,000 registered
documents: ``detect`` 0.6 ms; a ``str.find`` per document 85-95 ms; pyahocorasick 0.6 ms per search including
whitespace normalization, but 3.9 s to rebuild its automaton, which every registry change (each Qdrant search
result) would need. ``spans`` costs ~1 ms more (character offsets). Not detected: a document glued to other
text without whitespace (``"[1]Text"``); words compare case-sensitively.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normalizer.prompt_blocks import FEWEST_WORDS, recognise
from normalizer.repeated_blocks import RepeatedBlocks

DOCUMENT_PART_TYPE = "document"

_WORD = re.compile(r"\S+")


def content_id(text: str) -> str:
    """Doc id derived from a document's exact text: 16 hex digits of BLAKE2b."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Document:
    """One retrieved document."""

    id: str
    text: str
    title: str | None = None

    @classmethod
    def of(cls, text: str, *, id: str | None = None, title: str | None = None) -> Document:
        return cls(id=id or content_id(text), text=text, title=title)


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("\n", " ")


def render_document(document: Document) -> str:
    """The byte-stable block of one document (depends on the document only)."""
    title = f' title="{_attr(document.title)}"' if document.title else ""
    return f'<document id="{_attr(document.id)}"{title}>\n{document.text}\n</document>\n'


def render_system(system: str, documents: Sequence[Document]) -> str:
    """System message content: the system prompt followed by the document blocks, in the given order."""
    blocks = "".join(render_document(d) for d in documents)
    if not blocks:
        return system
    return f"{system}\n\n{blocks}" if system else blocks


def render(system: str, documents: Sequence[Document], question: str) -> list[dict[str, Any]]:
    """The messages list of a single-turn RAG prompt: system (+ documents), then the question."""
    return [
        {"role": "system", "content": render_system(system, documents)},
        {"role": "user", "content": question},
    ]


@dataclass(frozen=True, slots=True)
class StructuredPrompt:
    """A chat request whose documents were sent apart from the prompt."""

    system: str
    documents: tuple[Document, ...]
    messages: tuple[dict[str, Any], ...]
    """The conversation without system messages and without document parts."""

    def render_messages(self, documents: Sequence[Document] | None = None) -> list[dict[str, Any]]:
        """Full messages list with ``documents`` (default: retrieval order) in the system message."""
        docs = self.documents if documents is None else documents
        return [{"role": "system", "content": render_system(self.system, docs)}, *self.messages]


def _document_from(raw: Mapping[str, Any]) -> Document:
    text = raw.get("text")
    if not isinstance(text, str):
        raise ValueError("a document needs a string 'text'")
    doc_id = raw.get("id")
    title = raw.get("title")
    return Document.of(
        text,
        id=str(doc_id) if doc_id is not None else None,
        title=str(title) if title is not None else None,
    )


TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content part types that carry text: chat's ``text``, the Responses API's ``input_text`` and ``output_text``."""


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string as is, the text parts (:data:`TEXT_PARTS`) of a list joined by
    newlines (as chat templates join them); ``""`` when it has none. The one place message text is read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str))
    return ""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message (:func:`content_text` of its ``content``)."""
    return content_text(message.get("content"))


def extract_structured(body: Mapping[str, Any], documents_field: Any = None) -> StructuredPrompt | None:
    """Documents sent apart from the prompt (``documents_field``: the value of ``ragproxy.documents``, lifted out
    of the body; and ``document`` content parts), or ``None`` when the request carries none.

    Raises :class:`ValueError` on a malformed document (the caller answers 400).
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    if documents_field is None:  # documents can then only be content parts: most prompts have none, one pass
        for message in messages:
            if not isinstance(message, dict):
                raise ValueError("each message must be an object")
            if isinstance(message.get("content"), list):
                break
        else:
            return None
    documents: list[Document] = []
    if documents_field is not None:
        if not isinstance(documents_field, list):
            raise ValueError("ragproxy.documents must be a list of documents")
        for raw in documents_field:
            if not isinstance(raw, dict):
                raise ValueError("each entry of ragproxy.documents must be an object")
            documents.append(_document_from(raw))
    system_parts: list[str] = []
    rest: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be an object")
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") == DOCUMENT_PART_TYPE for p in content
        ):
            kept = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == DOCUMENT_PART_TYPE:
                    documents.append(_document_from(part))
                else:
                    kept.append(part)
            only_text = all(isinstance(p, dict) and p.get("type") == "text" for p in kept)
            message = {**message, "content": content_text(kept) if only_text else kept}
        if message.get("role") in ("system", "developer") and not rest:
            system_parts.append(message_text(message))
        else:
            rest.append(message)
    if not documents:
        return None
    return StructuredPrompt(
        system="\n\n".join(system_parts), documents=tuple(documents), messages=tuple(rest)
    )


@dataclass(frozen=True, slots=True)
class Span:
    """Where a registered document occurs in a text: ``text[start:end]``."""

    doc_id: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Entry:
    words: tuple[str, ...]
    anchor: int
    size: int


DEFAULT_MAX_BYTES = 128 * 1024 * 1024
_WORD_OVERHEAD = 56  # CPython: a short str object (49 B) plus its slot in the words tuple
_ENTRY_OVERHEAD = 512  # the tuple, the entry, its OrderedDict node and index slots


def entry_bytes(text: str, words: int) -> int:
    """What a registered document is charged against ``max_bytes``: an estimate of the memory it holds (its text
    as words, each a separate string object, plus bookkeeping); within a few percent of ``tracemalloc`` for
    documents of 10 to 1,000 words."""
    return len(text.encode("utf-8", "surrogatepass")) + _WORD_OVERHEAD * words + _ENTRY_OVERHEAD


class DocumentRegistry:
    """Recently retrieved documents (LRU of ``capacity`` documents and ``max_bytes``), found again inside prompt
    texts.

    ``anchor_words`` is the number of leading words hashed per document (shorter documents use all their
    words; documents with fewer than ``min_words`` words are not registered — too likely to occur by chance;
    neither is one that alone exceeds ``max_bytes``). ``bytes`` is the current total of :func:`entry_bytes`,
    ``evicted`` counts documents pushed out by either bound.
    """

    def __init__(self, capacity: int = 10_000, *, max_bytes: int = DEFAULT_MAX_BYTES, anchor_words: int = 8,
                 min_words: int = 4) -> None:
        if capacity < 1 or max_bytes < 1 or anchor_words < 1 or min_words < 1:
            raise ValueError("capacity, max_bytes, anchor_words and min_words must be positive")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.anchor_words = anchor_words
        self.min_words = min_words
        self.bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._by_anchor: dict[tuple[int, int], list[str]] = {}
        self._anchor_lengths: dict[int, int] = {}
        self._first_words: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._entries

    def add(self, text: str, doc_id: str | None = None) -> str | None:
        """Register a document's text; returns its id (``None`` when too short to register). A document registered
        already is only marked as recently added."""
        doc_id = doc_id or content_id(text)
        if doc_id in self._entries:
            self._entries.move_to_end(doc_id)
            return doc_id
        words = tuple(text.split())
        if len(words) < self.min_words:
            return None
        size = entry_bytes(text, len(words))
        if size > self.max_bytes:
            return None
        length = min(self.anchor_words, len(words))
        anchor = hash(words[:length])
        self._entries[doc_id] = _Entry(words, anchor, size)
        self.bytes += size
        self._by_anchor.setdefault((length, anchor), []).append(doc_id)
        self._anchor_lengths[length] = self._anchor_lengths.get(length, 0) + 1
        self._first_words[words[0]] = self._first_words.get(words[0], 0) + 1
        while len(self._entries) > self.capacity or self.bytes > self.max_bytes:
            self._forget(next(iter(self._entries)))
            self.evicted += 1
        return doc_id

    def add_many(self, texts: Iterable[str]) -> list[str | None]:
        return [self.add(t) for t in texts]

    def text_words(self, doc_id: str) -> tuple[str, ...] | None:
        entry = self._entries.get(doc_id)
        return entry.words if entry else None

    def _forget(self, doc_id: str) -> None:
        entry = self._entries.pop(doc_id)
        self.bytes -= entry.size
        length = min(self.anchor_words, len(entry.words))
        key = (length, entry.anchor)
        ids = self._by_anchor[key]
        ids.remove(doc_id)
        if not ids:
            del self._by_anchor[key]
        self._anchor_lengths[length] -= 1
        if not self._anchor_lengths[length]:
            del self._anchor_lengths[length]
        first = entry.words[0]
        self._first_words[first] -= 1
        if not self._first_words[first]:
            del self._first_words[first]

    def detect(self, prompt_text: str) -> list[str]:
        """Ids of the registered documents found in ``prompt_text``, in order of appearance."""
        return [doc_id for _, doc_id, _ in self._scan(prompt_text.split())]

    def spans(self, prompt_text: str) -> list[Span]:
        """Non-overlapping occurrences of registered documents, in order of appearance."""
        if not self._entries:
            return []
        matches = list(_WORD.finditer(prompt_text))
        return [
            Span(doc_id, matches[i].start(), matches[i + size - 1].end())
            for i, doc_id, size in self._scan([m.group() for m in matches])
        ]

    def _scan(self, words: list[str]) -> list[tuple[int, str, int]]:
        """``(word index, doc id, words)`` of each occurrence, longest document first at each position."""
        if not self._entries:
            return []
        lengths = sorted(self._anchor_lengths, reverse=True)
        first_words = self._first_words
        found: list[tuple[int, str, int]] = []
        i = 0
        n = len(words)
        while i < n:
            if words[i] not in first_words:
                i += 1
                continue
            best: tuple[str, int] | None = None
            for length in lengths:
                if i + length > n:
                    continue
                ids = self._by_anchor.get((length, hash(tuple(words[i : i + length]))))
                if not ids:
                    continue
                for doc_id in ids:
                    doc_words = self._entries[doc_id].words
                    size = len(doc_words)
                    if (best is None or size > best[1]) and tuple(words[i : i + size]) == doc_words:
                        best = (doc_id, size)
            if best is None:
                i += 1
                continue
            doc_id, size = best
            self._entries.move_to_end(doc_id)
            found.append((i, doc_id, size))
            i += size
        return found


def reorder_spans(text: str, spans: Sequence[Span], order: Sequence[str]) -> str:
    """``text`` with the documents at ``spans`` permuted into ``order`` (doc ids); the text between them
    stays.

    ``order`` must be a permutation of the spans' doc ids.
    """
    if sorted(order) != sorted(s.doc_id for s in spans):
        raise ValueError("order must be a permutation of the detected documents")
    pieces: dict[str, list[str]] = {}
    for span in spans:
        pieces.setdefault(span.doc_id, []).append(text[span.start : span.end])
    out: list[str] = []
    cursor = 0
    for span, doc_id in zip(spans, order, strict=True):
        out.append(text[cursor : span.start])
        out.append(pieces[doc_id].pop(0))
        cursor = span.end
    out.append(text[cursor:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class DetectedDocuments:
    """Registered documents found inside one message's text (the message holding the most)."""

    message: int
    """Index of that message in ``messages``."""
    text: str
    spans: tuple[Span, ...]

    def without_documents(self) -> str:
        """The message's text with its documents cut out (what the app wrote around them), line by line: each
        line's whitespace folded, empty lines dropped, a document's place a line break."""
        pieces, cursor = [], 0
        for span in self.spans:
            pieces.append(self.text[cursor : span.start])
            cursor = span.end
        pieces.append(self.text[cursor:])
        lines = (" ".join(line.split()) for line in "\n".join(pieces).splitlines())
        return "\n".join(line for line in lines if line)


@dataclass(frozen=True, slots=True)
class PromptDocuments:
    """The documents one chat request carries, read once before any cache tier: the exact key, the context
    signature and the KV stages all read this one result. ``documents`` are in the client's order."""

    documents: tuple[Document, ...] = ()
    structured: StructuredPrompt | None = None
    detected: DetectedDocuments | None = None

    @property
    def mode(self) -> str:
        """``"structured"``, ``"detected"`` or ``"plain"`` (no documents)."""
        return "structured" if self.structured else "detected" if self.detected else "plain"


NO_DOCUMENTS = PromptDocuments()


_PASTED_INTO = frozenset({"system", "developer", "user"})
"""The roles whose messages an app pastes documents into (an assistant's own numbered list is never one)."""


def read_prompt(body: Mapping[str, Any], documents_field: Any = None, registry: DocumentRegistry | None = None,
                repeated: RepeatedBlocks | None = None) -> PromptDocuments:
    """The documents of a chat body: sent apart (``ragproxy.documents``, ``document`` parts), else documents
    recognised in a message's text, else none. :class:`ValueError` for a malformed document.

    Recognised documents come from the message holding the most, found either way: registered documents (earlier
    Qdrant searches through the proxy, and, with ``repeated``, the paragraphs that moved between requests:
    :mod:`normalizer.repeated_blocks`, which observes each long system, developer or user message first) or, in
    such a message, blocks of the text's own structure (:mod:`normalizer.prompt_blocks`), whichever finds more
    there (registered ones on a tie). Without a ``registry`` (nothing in the proxy reads documents) nothing is
    recognised."""
    structured = extract_structured(body, documents_field)
    if structured is not None:
        return PromptDocuments(structured.documents, structured=structured)
    messages = body.get("messages")
    if registry is None or not isinstance(messages, list):
        return NO_DOCUMENTS
    best: DetectedDocuments | None = None
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            continue
        text = message["content"]
        # too few words to hold the blocks (most messages): nothing is looked for (positional split: no keyword parse)
        pasted = message.get("role") in _PASTED_INTO and len(text.split(None, FEWEST_WORDS - 1)) >= FEWEST_WORDS
        if pasted and repeated is not None:
            registry.add_many(repeated.observe(text))
        spans = registry.spans(text)
        if pasted:
            blocks = recognise(text)
            if len(blocks) > len(spans):  # each block's id is content_id of its exact text
                spans = [Span(content_id(text[b.start : b.end]), b.start, b.end) for b in blocks]
        if len(spans) > (len(best.spans) if best else 0):
            best = DetectedDocuments(index, text, tuple(spans))
    if best is None or len({s.doc_id for s in best.spans}) != len(best.spans):
        return NO_DOCUMENTS
    documents = tuple(Document(s.doc_id, best.text[s.start : s.end]) for s in best.spans)
    return PromptDocuments(documents, detected=best)


TEXT_FIELDS = ("text", "content", "page_content", "document", "chunk")


def payload_texts(search_response: Mapping[str, Any], fields: Sequence[str] = TEXT_FIELDS) -> list[str]:
    """Document texts in a Qdrant search/query answer (REST shape), to feed a :class:`DocumentRegistry`.

    Reads ``result`` as a list of points (search) or ``result.points`` (query API) and, per point, the first
    payload field of ``fields`` holding a string (LangChain stores ``page_content``, LlamaIndex ``text`` or a
    ``_node_content`` JSON with ``text``; the latter is read too).
    """
    result = search_response.get("result")
    if isinstance(result, dict):
        result = result.get("points")
    if not isinstance(result, list):
        return []
    texts: list[str] = []
    for point in result:
        payload = point.get("payload") if isinstance(point, dict) else None
        if not isinstance(payload, dict):
            continue
        text = next((payload[f] for f in fields if isinstance(payload.get(f), str)), None)
        if text is None and isinstance(payload.get("_node_content"), str):
            try:
                node = json.loads(payload["_node_content"])
            except ValueError:
                node = None
            if isinstance(node, dict) and isinstance(node.get("text"), str):
                text = node["text"]
        if text:
            texts.append(text)
    return texts
