"""Documents as evidence: what a cached answer rests on, and whether a new prompt still carries it.

A retrieval-augmented question carries the documents it retrieved itself, and a paraphrase rarely retrieves the
same ones in the same order. So the semantic tier does not ask for identical documents (they are left out of the
:class:`~normalizer.signature.ContextSignature` digest, apart from whether there are any); it asks whether the new
prompt still carries **the documents the cached answer rests on**, as :func:`supports` decides from the
:func:`evidence` kept with each cached question:

- an answer that cites its sources rests on the documents it cites: by id (``[doc-12]``), by position (``[2]``,
  ``[Source 2]``, ``[doc 2, doc 3]``, ``【2】``; 1-based, in the order the model saw them) or by title (a title of at
  least :data:`MIN_TITLE_CHARS` characters written in the answer);
- an answer that cites nothing rests, as far as the proxy can tell, on every document it was given.

A new prompt supports the answer when it carries every document the answer rests on with the same text (content
hash), and no document of both prompts changed its text under the same id. A client reads ``[2]`` as its own second
document, so an answer that cites by position is served :func:`renumbered`: each position rewritten to where the new
prompt holds that document. Whether the answer also serves the new
question is the threshold's business: the comparisons that calibrate it come from the candidates this rule lets
through, so its bound covers what the documents change too (docs/semantic.md).

Wire shape (JSON, kept in the vector payload and in the cold tier's entry meta)::

    {"documents": [[id, content hash], ...],   # in the order the model saw them
     "cited": [[position or 0, id], ...] | null}   # null: the answer cites nothing
    {"too_many": n}                             # more than MAX_DOCUMENTS documents: supports nothing

Its size is bounded whatever the client sends: at most :data:`MAX_DOCUMENTS` documents, an id longer than
:data:`MAX_ID_CHARS` kept as ``~`` and 16 hex digits of its BLAKE2b.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from normalizer.canonical_json import JSONValue
from normalizer.documents import Document, content_id

MAX_DOCUMENTS = 64
"""Evidence of a prompt with more documents is their count alone, and supports no other prompt: such a question is
answered from the cache only by an exact repeat."""
MAX_ID_CHARS = 64
MIN_TITLE_CHARS = 8
"""A shorter title ("FAQ", "Intro") appears in answers by chance too often to count as a citation."""

_BRACKETED = re.compile(r"(?<![\w)])\[([^\[\]\n]{1,200})\]|【([^【】\n]{1,200})】")
"""A bracketed citation; not an index (``a[1]``, ``f(x)[2]``), which renumbering must never touch."""
_POSITION = re.compile(r"(?:(?:doc(?:ument)?|source|ref(?:erence)?|passage|context|chunk)\s*#?\s*|#)?(\d{1,3})"
                       r"(?:[:†].*)?", re.IGNORECASE)
_SEPARATORS = re.compile(r"([,;]|\band\b)")


def evidence(answer: str, documents: Sequence[Document]) -> dict[str, JSONValue] | None:
    """What ``answer``, given ``documents`` (in the order the model saw them), rests on; ``None`` without
    documents."""
    if not documents:
        return None
    if len(documents) > MAX_DOCUMENTS:
        return {"too_many": len(documents)}
    ids = {document.id for document in documents}
    cited: dict[tuple[int, str], None] = {}
    for match in _BRACKETED.finditer(answer):
        for token in _SEPARATORS.split(match.group(1) or match.group(2))[::2]:
            token = token.strip()
            if token in ids:
                cited[(0, token)] = None
            position = _POSITION.fullmatch(token)
            if position is not None and 1 <= int(position.group(1)) <= len(documents):
                index = int(position.group(1))
                cited[(index, documents[index - 1].id)] = None
    for document in documents:
        if document.title and len(document.title) >= MIN_TITLE_CHARS and document.title in answer:
            cited[(0, document.id)] = None
    return {"documents": [[_ref(document.id), content_id(document.text)] for document in documents],
            "cited": [[position, _ref(doc_id)] for position, doc_id in cited] if cited else None}


def _ref(doc_id: str) -> str:
    """How evidence names a document: its id, or a digest of an id longer than :data:`MAX_ID_CHARS`."""
    return doc_id if len(doc_id) <= MAX_ID_CHARS else "~" + content_id(doc_id)


def without_citations(answer: str) -> str:
    """``answer`` without its bracketed citations: what two answers are compared on (two answers that cite the same
    document are not alike for it, nor unlike for citing different ones)."""
    return _BRACKETED.sub("", answer)


def supports(kept: Any, documents: Sequence[Document]) -> bool:
    """Whether a prompt carrying ``documents`` (the client's order) still supports an answer whose
    :func:`evidence` is ``kept`` (``None``: an answer given without documents, which needs none)."""
    if kept is None:
        return True
    if not isinstance(kept, Mapping):
        return False
    try:
        given = {str(doc_id): str(digest) for doc_id, digest in kept["documents"]}
        cited = kept.get("cited")
        needed = [(0, doc_id) for doc_id in given] if cited is None else [(int(p), str(i)) for p, i in cited]
    except (KeyError, TypeError, ValueError):  # not evidence this module wrote: supports nothing
        return False
    carried = {_ref(document.id): content_id(document.text) for document in documents}
    if any(given[doc_id] != digest for doc_id, digest in carried.items() if doc_id in given):
        return False  # a document of both prompts changed its text
    return all(doc_id in carried for _, doc_id in needed)


def renumbered(answer: str, kept: Any, documents: Sequence[Document]) -> str:
    """``answer`` (whose :func:`evidence` is ``kept``, which a prompt carrying ``documents`` :func:`supports`) with
    each positional citation rewritten to the position ``documents`` hold its document at (1-based)."""
    if not isinstance(kept, Mapping) or not kept.get("cited") or not any(p for p, _ in kept["cited"]):
        return answer
    given = [str(doc_id) for doc_id, _ in kept["documents"]]
    now = {_ref(document.id): position for position, document in enumerate(documents, 1)}

    def group(match: re.Match[str]) -> str:
        pieces = _SEPARATORS.split(match.group(0)[1:-1])
        for i in range(0, len(pieces), 2):
            position = _POSITION.fullmatch(pieces[i].strip())
            if position is not None and 1 <= (old := int(position.group(1))) <= len(given) \
                    and given[old - 1] in now and pieces[i].strip() not in now:  # an id is not a position
                pieces[i] = re.sub(r"\d{1,3}", str(now[given[old - 1]]), pieces[i], count=1)
        return match.group(0)[0] + "".join(pieces) + match.group(0)[-1]

    return _BRACKETED.sub(group, answer)
