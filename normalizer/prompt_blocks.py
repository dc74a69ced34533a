"""Documents recognised from a prompt's own structure: the blocks an app pastes into a message, found without any
search through the proxy (pure; :func:`normalizer.documents.read_prompt` uses it beside the registry of searched
documents, and the KV planner and the semantic tier read the one result).

Recognised shapes, each at the start of a line:

- **numbered passages**: ``[1] text``, ``【1】 text``, ``Document 1: text``, ``[Source 2] text``, ``Passage 3.`` (the
  words document, doc, source, passage, context, chunk, reference, excerpt, snippet, result, article; ``#`` and
  markdown bold allowed). The numbers count up by one, in one label style. The document is the text after its label
  (the label stays where it is: ``[1]`` still heads the first block after a reorder, which keeps a numbered list in
  order). Numbered lists (``1.``, ``2)``) are not passages: they are how questions list steps and options;
- **tagged blocks**: ``<document ...>...</document>`` and the same with doc, passage, chunk, context, search_result,
  result, excerpt, snippet, article or source: the whole element, tags and attributes included (an ``id`` or
  ``index`` attribute moves with its text, so the rank the app gave stays visible to the model). The first tag name
  in that order with enough blocks is used (a ``<source>`` inside each ``<document>`` is not a block of its own);
- **delimited blocks**: the text between lines of ````` (a fence without a language; a message with any fence
  that names one is code and has none recognised, and so has a block with ``{}=;<>`` or an indented line) or between
  identical rule lines (``---``, ``===``, ``***``, ``___``).

When several shapes are present, the outermost makes the blocks (a ``Document 1:`` label inside each
``<document>`` element leaves the elements the blocks), and a block that would hold part of another shape (an
opening tag without its close, one fence of a pair) is a doubt.

How a false recognition is kept harmless: a shape counts only with at least :data:`MIN_BLOCKS` blocks, every one of
at least :data:`MIN_WORDS` words and no two alike, and at most :data:`MAX_BLOCKS`; a numbered passage that is last
ends where the others' shape says (the end of its line when the others are one line each, else the first blank
line), and when the others hold blank lines its end is unknown and nothing is recognised. Any doubt leaves the
message as sent. Recognised blocks are never edited: the most the proxy does with them is permute whole blocks
(``routing.order`` ``reuse``, the default, or ``shift``; ``preserve`` never does) and route by them.

Not recognised here: documents joined by blank lines only (``"\\n\\n".join(texts)``: in one prompt, a paragraph of
one document cannot be told from the next document); those are found when the app's searches go through the proxy
(:class:`~normalizer.documents.DocumentRegistry`), or once they have moved between requests
(:mod:`normalizer.repeated_blocks`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

MIN_BLOCKS = 2
MIN_WORDS = 8
MAX_BLOCKS = 64
FEWEST_WORDS = MIN_BLOCKS * (MIN_WORDS - 2)
"""Words a text holding :data:`MIN_BLOCKS` blocks has at least (a block's edge may split one of its words): a caller
passes :func:`recognise` no text with fewer (most chat messages), which it would search for nothing."""


@dataclass(frozen=True, slots=True)
class Block:
    """One recognised document: ``text[start:end]``, from its first to its last non-blank character."""

    start: int
    end: int


_WORDS = (
    "document",
    "doc",
    "source",
    "passage",
    "context",
    "chunk",
    "reference",
    "excerpt",
    "snippet",
    "result",
    "article",
)
_NUMBERED = re.compile(
    r"[ \t]*(?:\*\*)?(?:"
    r"(?P<bracket>\[)(?P<n1>\d{1,3})\]"
    r"|(?P<cjk>【)(?P<n2>\d{1,3})】"
    r"|\[(?P<bword>" + "|".join(_WORDS) + r")[ \t]*#?[ \t]*(?P<n3>\d{1,3})\]"
    r"|(?P<word>" + "|".join(_WORDS) + r")[ \t]*#?[ \t]*(?P<n4>\d{1,3})[ \t]*(?P<end>[:.)\-\u2013]|(?=\r?\n))"
    r")(?:\*\*)?[ \t]*:?",
    re.IGNORECASE,
)
_LABEL_FIRST = frozenset("[【*" + "".join({w[0] for w in _WORDS}) + "".join({w[0].upper() for w in _WORDS}))
"""The first non-blank character a numbered label can start with: other lines are skipped without a regex."""
_TAGS = (
    "document",
    "doc",
    "passage",
    "chunk",
    "context",
    "search_result",
    "result",
    "excerpt",
    "snippet",
    "article",
    "source",
)
_OPEN = re.compile(r"<(?P<tag>" + "|".join(_TAGS) + r")(?:\s[^<>]*)?>", re.IGNORECASE)
_CLOSE = {tag: re.compile(rf"</{tag}\s*>", re.IGNORECASE) for tag in _TAGS}
_TAG_EDGE = re.compile(r"<(/?)(" + "|".join(_TAGS) + r")(?=[\s>/])", re.IGNORECASE)
_FENCE = re.compile(r"^[ \t]*```(?P<info>[^`\n]*)$", re.MULTILINE)
_RULE = re.compile(r"[ \t]*(?P<rule>-{3,}|={3,}|\*{3,}|_{3,})[ \t]*$", re.MULTILINE)
_RULE_FIRST = frozenset("-=*_")
BLANK_LINE = re.compile(r"\n[ \t]*\r?\n")
"""A line break, a line of nothing but blanks, a line break: where a paragraph ends."""
_CODE_CHARS = re.compile(r"[{}=;<>]|^(?: {4}|\t)\S", re.MULTILINE)


def recognise(text: str) -> tuple[Block, ...]:
    """The documents ``text`` carries as blocks of one recognised shape, in order; ``()`` when none is recognised
    (or on any doubt). When several shapes yield blocks, the outermost is used: the one whose first label, tag,
    fence or rule comes first (a ``Document 1:`` label inside each ``<document>`` element leaves the elements the
    blocks). A block that holds part of another shape (an opening tag without its close, one fence of a pair) is a
    doubt."""
    found = [(start, blocks) for start, blocks in (find(text) for find in _FINDERS) if blocks]
    if not found:
        return ()
    _, blocks = min(found, key=lambda candidate: candidate[0])
    return blocks if all(_balanced(text[b.start : b.end]) for b in blocks) else ()


def _balanced(block: str) -> bool:
    """Whether ``block`` holds whole tagged elements and whole fenced blocks only."""
    if "```" in block and len(_FENCE.findall(block)) % 2:
        return False
    if "<" not in block:
        return True
    depth: dict[str, int] = {}
    for edge in _TAG_EDGE.finditer(block):
        name = edge[2].lower()
        depth[name] = depth.get(name, 0) + (-1 if edge[1] else 1)
        if depth[name] < 0:
            return False
    return not any(depth.values())


_Found = tuple[int, tuple[Block, ...]]
"""Where a shape's first label, tag, fence or rule starts, and its blocks (none: not that shape)."""
_NONE: _Found = (0, ())


def _trimmed(text: str, start: int, end: int) -> Block | None:
    """The block ``text[start:end]`` without its surrounding whitespace; ``None`` when empty."""
    piece = text[start:end]
    stripped = piece.strip()
    if not stripped:
        return None
    offset = start + (len(piece) - len(piece.lstrip()))
    return Block(offset, offset + len(stripped))


def _accepted(text: str, blocks: list[Block | None]) -> tuple[Block, ...]:
    """``blocks`` when they pass every guard, else ``()``."""
    if not MIN_BLOCKS <= len(blocks) <= MAX_BLOCKS:
        return ()
    kept = [b for b in blocks if b is not None]
    if len(kept) != len(blocks):
        return ()
    texts = [text[b.start : b.end] for b in kept]
    if any(len(t.split(maxsplit=MIN_WORDS - 1)) < MIN_WORDS for t in texts) or len(set(texts)) != len(texts):
        return ()
    return tuple(kept)


def _style(match: re.Match[str]) -> tuple[str, ...]:
    if match["bracket"]:
        return ("[n]",)
    if match["cjk"]:
        return ("【n】",)
    if match["bword"]:
        return ("[word n]", match["bword"].lower())
    return ("word n", match["word"].lower(), match["end"] or "")


def _number(match: re.Match[str]) -> int:
    return int(match["n1"] or match["n2"] or match["n3"] or match["n4"])


def _line_starts(text: str, first: frozenset[str]) -> list[int]:
    """Where the lines of ``text`` start whose first non-blank character is in ``first``."""
    starts, cursor = [], 0
    for line in text.split("\n"):
        stripped = line.lstrip(" \t")
        if stripped and stripped[0] in first:
            starts.append(cursor)
        cursor += len(line) + 1
    return starts


def _numbered(text: str) -> _Found:
    labels = [m for start in _line_starts(text, _LABEL_FIRST) if (m := _NUMBERED.match(text, start))]
    if len(labels) < MIN_BLOCKS:
        return _NONE
    best: list[re.Match[str]] = []
    run: list[re.Match[str]] = []
    for label in labels:  # the longest run of one style whose numbers count up by one
        if run and _style(label) == _style(run[-1]) and _number(label) == _number(run[-1]) + 1:
            run.append(label)
        else:
            run = [label]
        if len(run) > len(best):
            best = list(run)
    if len(best) < MIN_BLOCKS:
        return _NONE
    bodies = [text[a.end() : b.start()].strip() for a, b in pairwise(best)]
    last_start = best[-1].end()
    rest = text[last_start:]
    lead = len(rest) - len(rest.lstrip())
    if all("\n" not in body for body in bodies):
        line_end = rest.find("\n", lead)
        last_end = len(text) if line_end < 0 else last_start + line_end
    elif not any(BLANK_LINE.search(body) for body in bodies):
        blank = BLANK_LINE.search(rest, lead)
        last_end = len(text) if blank is None else last_start + blank.start()
    else:
        return _NONE  # multi-paragraph passages: where the last one ends is unknown
    blocks = [_trimmed(text, a.end(), b.start()) for a, b in pairwise(best)]
    blocks.append(_trimmed(text, last_start, last_end))
    return best[0].start(), _accepted(text, blocks)


def _tagged(text: str) -> _Found:
    if "<" not in text:
        return _NONE
    by_tag: dict[str, list[re.Match[str]]] = {}
    for opening in _OPEN.finditer(text):
        by_tag.setdefault(opening["tag"].lower(), []).append(opening)
    for tag in _TAGS:
        opens = by_tag.get(tag, [])
        if len(opens) < MIN_BLOCKS:
            continue
        blocks: list[Block | None] = []
        inner: list[Block | None] = []
        cursor = 0
        for index, opening in enumerate(opens):
            if opening.start() < cursor:
                return _NONE  # nested in the previous element
            closing = _CLOSE[tag].search(text, opening.end())
            following = opens[index + 1].start() if index + 1 < len(opens) else len(text)
            if closing is None or closing.start() > following:
                return _NONE  # unclosed, or a second opening before the close
            blocks.append(Block(opening.start(), closing.end()))
            inner.append(_trimmed(text, opening.end(), closing.start()))
            cursor = closing.end()
        if _accepted(text, inner):  # the elements pass with their texts
            return opens[0].start(), tuple(b for b in blocks if b is not None)
        return _NONE
    return _NONE


def _fenced(text: str) -> _Found:
    if "```" not in text:
        return _NONE
    fences = list(_FENCE.finditer(text))
    if len(fences) % 2 or any(f["info"].strip() for f in fences):
        return _NONE  # unpaired, or code in a named language
    blocks = [_trimmed(text, a.end(), b.start()) for a, b in zip(fences[::2], fences[1::2], strict=True)]
    if any(b is not None and _CODE_CHARS.search(text, b.start, b.end) for b in blocks):
        return _NONE
    return fences[0].start(), _accepted(text, blocks)


def _ruled(text: str) -> _Found:
    rules = [m for start in _line_starts(text, _RULE_FIRST) if (m := _RULE.match(text, start))]
    if len(rules) < MIN_BLOCKS + 1:
        return _NONE
    if len({r["rule"] for r in rules}) != 1:
        return _NONE
    return rules[0].start(), _accepted(text, [_trimmed(text, a.end(), b.start()) for a, b in pairwise(rules)])


_FINDERS = (_numbered, _tagged, _fenced, _ruled)
