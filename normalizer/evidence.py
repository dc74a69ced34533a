"""Documents as evidence: what a cached answer rests on, and whether a new prompt still carries it.

A retrieval-augmented question carries the documents it retrieved itself, and a paraphrase rarely retrieves the
same ones in the same order. So the semantic tier does not ask for identical documents (they are left out of the
:class:`~normalizer.signature.ContextSignature` digest, apart from whether there are any); it asks whether the new
prompt still carries **the documents the cached answer rests on**, and adds none that could change it, as
:func:`unsupported` decides from the :func:`evidence` kept with each cached question.

What an answer rests on does not depend on how it cites. Its content decides; its citations are one signal among
others:

- **its content**: a document holds the answer's distinctive content, the words and numbers the answer writes that
  its question does not and that not every given document holds (:func:`content_words`): one of its figures (two
  digits or more: a dose, a year, a price), or words weighing :data:`MIN_SHARED_WEIGHT` at least and half as much as
  the document holding most of them (a number weighs :data:`NUMBER_WEIGHT`, a word 1: an answer written from one
  document shares a few topic words with the others too);
- **its citations**, in whatever form: by position (``[2]``, ``[Source 2]``, ``[doc 2, doc 3]``, ``【2】``; 1-based,
  in the order the model saw them), by id in a bracket, with or without a label (``[doc-12]``, ``[source: faq-12]``),
  by a distinctive id written anywhere (``faq-12``, ``(doc-12)``: an id of :data:`MIN_BARE_ID_CHARS` characters at
  least with a digit or a punctuation mark in it), or by title (at least :data:`MIN_TITLE_CHARS` characters).

A citation counts where the cited document holds some of the answer's distinctive content (one word is enough: it
tells which of the documents holding that word is the source), or where the answer has no content of its own
(``Yes [2].``); one in brackets that its document does not bear out says nothing, and served, a bracketed citation
of a document the new prompt lacks is taken out (:func:`renumbered`). A document named in the prose (a title, an id
outside brackets) stays named in every copy served, so the answer rests on it whatever its content. An answer
whose content comes from none of its documents and that names none in its prose rests on none.

A new prompt supports the answer when it carries every document the answer rests on with the same text (content
hash), no document of both prompts changed its text under the same id, and no document it **adds** (one the answer
was not given) restates the answer's content, one of its figures or a third of its words (an erratum restating the
dose the answer gives, say): the answer was never written with that document in view. A client reads ``[2]`` as
its own second document, so an answer that cites by position is served :func:`renumbered`: each position rewritten
to where the new prompt holds that document. Only citations are rewritten (:func:`citations`): never code, maths,
JSON, lists, intervals or ratios. Whether the answer also serves the new question is the threshold's business: the
comparisons that calibrate it come from the candidates this rule lets through, so its bound covers what the documents
change too (docs/semantic.md).

Wire shape (JSON, kept in the vector payload and in the cold tier's entry meta)::

    {"documents": [[id, content hash], ...],     # in the order the model saw them
     "cited": [[position or 0, id], ...] | null,  # its citations (renumbering reads the positions)
     "rests_on": [index, ...],                    # what it rests on (0-based, in "documents"): cited or used
     "content": [word, ...]}                      # its distinctive content, numbers first (added documents)
    {"too_many": n}                               # more than MAX_DOCUMENTS documents: supports nothing

Evidence written without ``rests_on`` rests on what it cites, or on every document when it cites none. Its size is
bounded whatever the client sends: at most :data:`MAX_DOCUMENTS` documents, an id longer than :data:`MAX_ID_CHARS`
kept as ``~`` and 16 hex digits of its BLAKE2b, at most :data:`MAX_CONTENT_WORDS` content words of at most
:data:`MAX_WORD_CHARS` characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from normalizer.canonical_json import JSONValue
from normalizer.documents import Document, content_id

MAX_DOCUMENTS = 64
"""Evidence of a prompt with more documents is their count alone, and supports no other prompt: such a question is
answered from the cache only by an exact repeat."""
MAX_ID_CHARS = 64
MIN_TITLE_CHARS = 8
"""A shorter title ("FAQ", "Intro") appears in answers by chance too often to count as a citation."""
MIN_BARE_ID_CHARS = 4
"""An id written outside a bracket counts as a citation from this length, with a digit or punctuation in it
(``faq-12``, ``kb/311``): a plain word ("intro", "faq") is written by chance."""
MIN_SHARED_WEIGHT = 2
"""How much of an answer's distinctive content a document holds to be one it rests on (or, added, one that could
change it): two words, or one number."""
NUMBER_WEIGHT = 2
"""A number (a dose, a year, a price) is a fact by itself; a single digit weighs as a word."""
MIN_WORD_CHARS = 4
MAX_CONTENT_WORDS = 24
MAX_WORD_CHARS = 32

_STOP_WORDS = """
about above across after again against almost along already also although always among another answer answers
anyone anything around because been before behind being below between both cannot could does doing done down during
each either else enough even ever every everyone everything fact from further given have having here however into
itself just least less like made make makes many might more most much must near need needs neither never none only
other others otherwise ought over perhaps please question questions rather really said same says seem seems shall
should show shows since some something such sure than that their theirs them themselves then there therefore these
they thing things this those though through thus under until upon used uses using usually very want well were what
whatever when where whether which while whom whose will with within without would your yours yourself according
source sources document documents passage passages context cited cite note notes
"""
_STOP = frozenset(_STOP_WORDS.split())
"""Words that say nothing about which document an answer comes from."""

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")
_BRACKETED = re.compile(r"(?<![\w)])\[([^\[\]\n]{1,200})\]|【([^【】\n]{1,200})】")
"""A bracketed group; not an index (``a[1]``, ``f(x)[2]``). Whether it is a citation is :func:`citations`'s call."""
_PROTECTED = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*(?P=fence)[ \t]*$|\Z)"  # fenced code block
    r"|(?P<ticks>`+).+?(?<!`)(?P=ticks)(?!`)"  # inline code span
    r"|\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)"  # display and inline maths, TeX delimiters
    r"|\$(?=[^\s$])[^$\n]*?(?<=[^\s$\\])\$(?!\d)",  # inline maths $...$ (a price, "$5 and $10", is not)
    re.MULTILINE | re.DOTALL)
"""What is not prose: a bracket inside is never a citation."""
_NESTING = re.compile(r"[\[\]{}]")
_OPERATOR = re.compile(r"(?:[=+%&^]|\b(?:lists?|arrays?|vectors?|tuples?|matri(?:x|ces)|returns?|gives|yields|"
                       r"outputs?|prints|equals|becomes)\b)\s*\Z", re.IGNORECASE)
"""A bracket after an operator or a word that announces a value (``x = [1, 2]``, ``returns [1, 2, 3]``, ``the list
[1, 2]``) is a value, not a citation (not after ``|``, ``*``, ``>`` or ``-``: a table cell, bold, a quote or a list
item of Markdown may hold a citation)."""
_LABEL = re.compile(r"(?:doc(?:ument)?|source|ref(?:erence)?|passage|context|chunk|id|cite|citation|see)s?"
                    r"(?:\s*[:#]\s*|\s+)", re.IGNORECASE)
_POSITION = re.compile(r"(?:(?:doc(?:ument)?|source|ref(?:erence)?|passage|context|chunk)\s*#?\s*|#)?(\d{1,3})"
                       r"(?:(?::\d+)?†.*|:\s*[^\d\s].*)?", re.IGNORECASE)
"""A position, with an optional label and an optional ``:note`` or ``:0†source`` tail; never a ratio (``3:1``)."""
_SEPARATORS = re.compile(r"([,;]|\band\b)")
_ID_LIKE = re.compile(r"[\d\-_./:#]")
_VALUE = re.compile(r"\s*(?:[-+]?0|[-+]?\d*\.\d+|-\d+|\d+\s*:\s*\d+|\d{4,}|.*[\"'{}=].*)\s*")
"""A token no citation has: zero, a decimal, a negative number, a ratio, a long number, a quoted string or code
(:func:`without_citations`, which has no documents to tell positions and ids by)."""


def citations(answer: str) -> Iterator[tuple[re.Match[str], list[str]]]:
    """The bracketed groups of ``answer`` that may be citations, each with its tokens: only in prose (not in code,
    maths or a ``{...}``/``[...]`` value), not after an operator, not glued to a word or an index before it
    (``matrix[i][2]``; ``[1][3]`` is two citations)."""
    masked = _PROTECTED.sub(lambda m: "\0" * (m.end() - m.start()), answer) if ("`" in answer or "$" in answer
                                                                               or "\\" in answer) else answer
    nested: set[int] = set()
    depth = 0
    for brace in _NESTING.finditer(masked):
        if brace.group() in "[{":
            if depth and brace.group() == "[":
                nested.add(brace.start())
            depth += 1
        else:
            depth = max(0, depth - 1)
    cited_end = -1
    for match in _BRACKETED.finditer(masked):
        start = match.start()
        if start in nested or _OPERATOR.search(masked, max(0, start - 12), start) \
                or (start and masked[start - 1] == "]" and cited_end != start):
            continue
        cited_end = match.end()
        yield match, _SEPARATORS.split(match.group(1) or match.group(2))


def _position(token: str, count: int) -> int | None:
    """The 1-based position ``token`` cites among ``count`` documents, if it is one."""
    position = _POSITION.fullmatch(token.strip())
    return int(position.group(1)) if position is not None and 1 <= int(position.group(1)) <= count else None


def _unlabelled(token: str) -> str:
    """``token`` without a label before it (``source: faq-12`` → ``faq-12``)."""
    token = token.strip()
    label = _LABEL.match(token)
    return token[label.end():] if label is not None and label.end() < len(token) else token


def _cited_id(token: str, ids: Mapping[str, int]) -> str | None:
    """The document id ``token`` names, with or without a label (``faq-12``, ``source: faq-12``)."""
    token = token.strip()
    if token in ids:
        return token
    bare = _unlabelled(token)
    return bare if bare in ids else None


def _cite(token: str, ids: Mapping[str, int], count: int) -> tuple[int, str | None] | None:
    """What one token of a citation names: ``(0, id)`` (an id, labelled or not), ``(position, None)``, else ``None``."""
    doc_id = _cited_id(token, ids)
    if doc_id is not None:
        return 0, doc_id
    position = _position(token, count)
    return (position, None) if position is not None else None


def content_words(text: str) -> set[str]:
    """``text``'s content: numbers and words of :data:`MIN_WORD_CHARS` to :data:`MAX_WORD_CHARS` letters that are not
    :data:`_STOP` words, lower-cased."""
    return {token for token in _TOKEN.findall(text.lower()) if token[0].isdigit()
            or (MIN_WORD_CHARS <= len(token) <= MAX_WORD_CHARS and token not in _STOP)}


def _tokens(text: str) -> frozenset[str]:
    """Every number and word of ``text``, lower-cased: what an answer's :func:`content_words` are looked up in."""
    return frozenset(_TOKEN.findall(text.lower()))


def _figure(word: str) -> bool:
    """Whether a content word is a figure (a dose, a year, a price: two digits or more), a fact by itself."""
    return word[0].isdigit() and len(word) > 1


def _weight(words: set[str] | frozenset[str]) -> int:
    return sum(NUMBER_WEIGHT if _figure(word) else 1 for word in words)


def _restates(words: frozenset[str], content: frozenset[str]) -> bool:
    """Whether a document holding ``words`` restates an answer's ``content``: one of its figures, or a third of its
    words (two at least)."""
    shared = words & content
    return any(map(_figure, shared)) or len(shared) >= max(MIN_SHARED_WEIGHT, len(content) / 3)


def evidence(answer: str, documents: Sequence[Document], question: str = "") -> dict[str, JSONValue] | None:
    """What ``answer`` to ``question``, given ``documents`` (in the order the model saw them), rests on; ``None``
    without documents."""
    if not documents:
        return None
    if len(documents) > MAX_DOCUMENTS:
        return {"too_many": len(documents)}
    ids = {document.id: i for i, document in enumerate(documents)}
    cited: dict[tuple[int, str], None] = {}
    for _, pieces in citations(answer):
        group = [cite for token in pieces[::2] if (cite := _cite(token, ids, len(documents))) is not None]
        if len(group) < len(pieces[::2]):
            continue  # a list or an interval is no citation
        for position, doc_id in group:
            cited[(position, doc_id or documents[position - 1].id)] = None
    prose = without_citations(answer)
    written: dict[str, None] = {}  # named in the prose (a title, an id outside brackets): no served answer loses it
    for document in documents:
        title = document.title or ""
        titled = len(title) >= MIN_TITLE_CHARS and title in prose
        if titled or (_ID_LIKE.search(document.id) and len(document.id) >= MIN_BARE_ID_CHARS and document.id in prose
                      and re.search(rf"(?<![\w-]){re.escape(document.id)}(?![\w-])", prose)):
            cited[(0, document.id)] = None
            written[document.id] = None
    for document in documents:  # an id or a title it writes is no content
        for name in (document.id, document.title):
            if name and len(name) >= MIN_BARE_ID_CHARS:
                prose = prose.replace(name, " ")
    own = content_words(prose) - content_words(question)
    held = [own & _tokens(document.text) for document in documents]
    # a citation is one signal: it counts where the cited document holds some of the answer's content, or where the
    # answer has none of its own to judge by ("Yes [2]"); an answer whose content comes from elsewhere does not rest
    # on what it cites in brackets (served, such a citation is taken out), but one it names in its prose stays in
    # every copy served, so the answer needs that document
    rests_on = {doc_id: None for _, doc_id in cited if not own or held[ids[doc_id]] or doc_id in written}
    if len(documents) > 1:  # what every document holds tells none of them apart
        everywhere = set.intersection(*held)
        held = [words - everywhere for words in held]
    best = max(map(_weight, held))
    grounded: set[str] = set()
    for document, words in zip(documents, held, strict=True):
        if any(map(_figure, words)) or MIN_SHARED_WEIGHT <= _weight(words) >= best / 2:
            rests_on[document.id] = None
            grounded |= words
    content = sorted(grounded or own, key=lambda w: (not _figure(w), -len(w), w))[:MAX_CONTENT_WORDS]
    return {"documents": [[_ref(document.id), content_id(document.text)] for document in documents],
            "cited": [[position, _ref(doc_id)] for position, doc_id in cited] if cited else None,
            "rests_on": [ids[doc_id] for doc_id in rests_on], "content": list(content)}


def _ref(doc_id: str) -> str:
    """How evidence names a document: its id, or a digest of an id longer than :data:`MAX_ID_CHARS`."""
    return doc_id if len(doc_id) <= MAX_ID_CHARS else "~" + content_id(doc_id)


def without_citations(answer: str) -> str:
    """``answer`` without its bracketed citations (:func:`citations`; a group holding a value, :data:`_VALUE`, is
    kept): what two answers are compared on (two answers that cite the same document are not alike for it, nor
    unlike for citing different ones)."""
    spans = [match.span() for match, pieces in citations(answer) if not any(map(_VALUE.fullmatch, pieces[::2]))]
    if not spans:
        return answer
    pieces, at = [], 0
    for start, end in spans:
        pieces.append(answer[at:start])
        at = end
    return "".join(pieces) + answer[at:]


class Carried:
    """The documents a new prompt carries, read once per lookup for every candidate's :func:`unsupported`."""

    __slots__ = ("_words", "digests", "documents")

    def __init__(self, documents: Sequence[Document]) -> None:
        self.documents = tuple(documents)
        self.digests = {_ref(document.id): content_id(document.text) for document in self.documents}
        self._words: dict[str, frozenset[str]] = {}

    def words(self, document: Document) -> frozenset[str]:
        """A carried document's words (:func:`_tokens`), read once."""
        words = self._words.get(document.id)
        if words is None:
            words = self._words[document.id] = _tokens(document.text)
        return words


def unsupported(kept: Any, documents: Sequence[Document] | Carried) -> str | None:
    """Why a prompt carrying ``documents`` (the client's order) cannot be served an answer whose :func:`evidence` is
    ``kept`` (``None``: an answer given without documents, which needs none): ``documents`` (a document it rests on
    is missing, or one of both prompts changed its text), ``added_document`` (a document it was not given holds its
    content), else ``None``."""
    if kept is None:
        return None
    carried = documents if isinstance(documents, Carried) else Carried(documents)
    if not isinstance(kept, Mapping):
        return "documents"
    try:
        given = {str(doc_id): str(digest) for doc_id, digest in kept["documents"]}
        if "rests_on" in kept:
            order = list(given)
            needed = [order[int(index)] for index in kept["rests_on"]]
        else:
            cited = kept.get("cited")
            needed = list(given) if cited is None else [str(doc_id) for _, doc_id in cited]
        content = frozenset(str(word) for word in kept.get("content") or ())
    except (KeyError, IndexError, TypeError, ValueError):  # not evidence this module wrote: supports nothing
        return "documents"
    if any(given[doc_id] != digest for doc_id, digest in carried.digests.items() if doc_id in given) \
            or not all(doc_id in carried.digests for doc_id in needed):
        return "documents"
    if content and any(_ref(document.id) not in given and _restates(carried.words(document), content)
                       for document in carried.documents):
        return "added_document"
    return None


def renumbered(answer: str, kept: Any, documents: Sequence[Document]) -> str:
    """``answer`` (whose :func:`evidence` is ``kept``, which a prompt carrying ``documents`` supports) as the client of
    that prompt reads it: each positional citation rewritten to the position ``documents`` hold its document at
    (1-based), and each citation of a document ``documents`` lack taken out (one the answer does not rest on, or the
    prompt would not support it: left in, it would name another document or none). A bracketed group is edited only
    when it is a citation (:func:`citations`) and every token in it is a position or a document's id; nothing else
    changes (an id or a title written outside brackets stays)."""
    if not isinstance(kept, Mapping) or not kept.get("cited"):
        return answer
    given = [str(doc_id) for doc_id, _ in kept["documents"]]
    now = {_ref(document.id): position for position, document in enumerate(documents, 1)}
    ids = {doc_id: 0 for doc_id in (*given, *now)}
    edits: list[tuple[int, int, str]] = []
    for match, pieces in citations(answer):
        if not all(_cite(token, ids, len(given)) for token in pieces[::2]):
            continue  # not a citation throughout: a list, an interval, a note
        left: list[tuple[str, str]] = []  # (separator before it, token) of the tokens that stay
        for i in range(0, len(pieces), 2):
            token, named = pieces[i], _cited_id(pieces[i], ids)
            old = _position(token, len(given)) if named is None else None
            document = named if named is not None else given[old - 1] if old is not None else None
            if document is not None and document not in now:
                continue  # the new prompt lacks it
            if old is not None and document is not None and now[document] != old:
                token = re.sub(r"\d{1,3}", str(now[document]), token, count=1)
            left.append((pieces[i - 1] if i else "", token))
        text = match.group(0)
        if not left:  # nothing of it is in the new prompt: the citation goes, with the space before it
            start = match.start()
            while start and answer[start - 1] in " \t":
                start -= 1
            edits.append((start, match.end(), ""))
            continue
        rebuilt = left[0][1].lstrip() if len(left) < len(pieces[::2]) else left[0][1]
        rebuilt += "".join(separator + token for separator, token in left[1:])
        if rebuilt != text[1:-1]:
            edits.append((match.start(), match.end(), text[0] + rebuilt + text[-1]))
    for start, end, text in reversed(edits):
        answer = answer[:start] + text + answer[end:]
    return answer
