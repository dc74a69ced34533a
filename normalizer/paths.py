"""The front door's path rules, and the typed paths and queries the proxy builds upstream requests from.

**One reading of a request path.** The data plane routes on the path percent-decoded once. A path that some server
on the way would read differently is refused before routing (400 ``bad_path``), for every route
(:func:`path_problem`):

* characters that must be percent-encoded (anything but printable ASCII), backslashes, and control characters
  once decoded (``%00``, ``%0a``, ...);
* dot segments (``/./``, ``/../``, a trailing ``/.``): aiohttp-, Express- and nginx-fronted servers resolve them
  (RFC 3986 §5.2.4);
* repeated slashes (``//``): merged by nginx and others;
* percent-encoded dots, slashes and backslashes (``%2e``, ``%2f``, ``%5c``, any case): decoded or turned into
  separators by some servers and not by others;
* a path that still holds ``%`` once decoded (``%252e``: a server that decodes twice reads ``..``), one that is
  not valid UTF-8 once decoded (``%c0%ae`` is an overlong ``.`` that lenient decoders accept), and ``;`` anywhere
  (``..;/``: Tomcat and Spring drop ``;`` path parameters and then resolve the dot segment).

No client library sends such paths for the APIs the proxy serves.

**Paths and queries are built, not relayed.** An endpoint row names an exact :class:`PathTemplate` (literal
segments and typed :class:`Parameter` s such as :data:`RESPONSE_ID`) and the typed :class:`Query` parameters it
takes; :func:`upstream_target` matches a request against them and rebuilds the upstream's path and query from what
it checked — the client's path, query string and encoding never reach an upstream. :class:`PathAllowList` is the
operator's list of other LLM API requests the generic pass-through forwards (``upstreams.llm_passthrough``):
``"METHOD /path"`` patterns whose ``*`` segments are typed as :data:`SEGMENT`, rebuilt the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlencode

_UNUSUAL_CHARACTER = re.compile(r"[^\x21-\x24\x26-\x3a\x3c-\x5b\x5d-\x7e]")
"""Anything but printable ASCII, and ``%``, ``;`` and ``\\``."""
_ENCODED = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(raw_path: str) -> str | None:
    """Why ``raw_path`` (as sent, query included) may be read differently by some server on the way, or ``None``
    when it has one reading (see the module docstring)."""
    raw = raw_path.partition("?")[0]
    if "//" not in raw and "/." not in raw and not _UNUSUAL_CHARACTER.search(raw):
        return None
    if re.search(r"[^\x21-\x7e]", raw):
        return "paths hold printable ASCII only (percent-encode anything else)"
    if "\\" in raw:
        return "backslashes are not allowed in paths"
    if _ENCODED.search(raw):
        return "percent-encoded dots, slashes and backslashes are not allowed in paths"
    try:
        decoded = unquote_to_bytes(raw).decode("utf-8") if "%" in raw else raw
    except UnicodeDecodeError:
        return "the path is not valid UTF-8 once percent-decoded (overlong or invalid sequences)"
    if "%" in decoded:
        return "the path still holds '%' once percent-decoded (encoded twice)"
    if ";" in decoded:
        return "';' (path parameters) is not allowed in paths"
    if "//" in decoded:
        return "repeated slashes are not allowed in paths"
    if any(segment in (".", "..") for segment in decoded.split("/")):
        return "dot segments (. and ..) are not allowed in paths"
    if _CONTROL.search(decoded):
        return "control characters are not allowed in paths"
    return None


@dataclass(frozen=True, slots=True)
class Parameter:
    """What one path segment or query value may be: ``what`` it is (for error messages), the full-match
    ``pattern`` of its values, and an ``example`` value (what tests and ``bench abuse`` fill rows with)."""

    what: str
    pattern: re.Pattern[str]
    example: str

    def accepts(self, value: str) -> bool:
        return self.pattern.fullmatch(value) is not None


RESPONSE_ID = Parameter("a response id (resp_ and letters or digits)", re.compile(r"resp_[A-Za-z0-9]{1,200}"),
                        "resp_" + "0" * 48)
"""A stored response's id, as OpenAI (``resp_`` and 48 hex digits), vLLM and SGLang (``resp_`` and a uuid's 32 hex
digits) make them."""
ITEM_ID = Parameter("an item id (a lower-case prefix, _, letters or digits)",
                    re.compile(r"[a-z]{1,24}_[A-Za-z0-9]{1,200}"), "msg_" + "0" * 48)
"""An item's id (``msg_``, ``fc_``, ``rs_``, ``ws_``... and letters or digits), as the Responses API makes them."""
SEGMENT = Parameter("a path segment of letters, digits and ._:@+=-",
                    re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}"), "x")
"""One segment of an operator's pass-through pattern (``*``): a model name such as ``llama3:8b`` or ``gpt-4o``."""


class PathTemplate:
    """An exact path: literal segments and ``{name}`` segments typed by ``parameters``
    (``PathTemplate("/v1/responses/{response_id}", {"response_id": RESPONSE_ID})``). No prefixes: a path matches
    only with as many segments as the template."""

    __slots__ = ("_parts", "parameters", "template")

    def __init__(self, template: str, parameters: Mapping[str, Parameter] | None = None) -> None:
        self.template = template
        self.parameters = dict(parameters or {})
        parts: list[str | tuple[str, Parameter]] = []
        for segment in template.split("/"):
            if segment.startswith("{") and segment.endswith("}"):
                parts.append((segment[1:-1], self.parameters[segment[1:-1]]))
            else:
                parts.append(segment)
        self._parts = tuple(parts)

    @property
    def literal(self) -> bool:
        """Whether the template has no parameter (it is one path)."""
        return not self.parameters

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters of a decoded ``path`` that this template names, each of its type; ``None`` otherwise."""
        if self.literal:
            return {} if path == self.template else None
        segments = path.split("/")
        if len(segments) != len(self._parts):
            return None
        values: dict[str, str] = {}
        for part, segment in zip(self._parts, segments, strict=True):
            if isinstance(part, str):
                if part != segment:
                    return None
            elif part[1].accepts(segment):
                values[part[0]] = segment
            else:
                return None
        return values

    def build(self, values: Mapping[str, str]) -> str:
        """The path with ``values`` in its parameters (each checked against its type again)."""
        if self.literal:
            return self.template
        segments = []
        for part in self._parts:
            if isinstance(part, str):
                segments.append(part)
                continue
            value = values[part[0]]
            if not part[1].accepts(value):
                raise ValueError(f"{part[0]}: {value!r} is not {part[1].what}")
            segments.append(quote(value, safe=":@+=-._~"))
        return "/".join(segments)

    def example(self, values: Mapping[str, str] | None = None) -> str:
        """The path with ``values`` where given, each other parameter's example value elsewhere."""
        return self.build({name: (values or {}).get(name, parameter.example)
                           for name, parameter in self.parameters.items()})

    def __repr__(self) -> str:
        return f"PathTemplate({self.template!r})"


class QueryProblem(ValueError):
    """A query string the row does not take: a parameter it does not know, or a value not of its type."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class QueryParameter:
    """One parameter a row's query takes: its wire ``names`` (``include`` and ``include[]`` are one parameter),
    its type, and whether it may repeat."""

    names: tuple[str, ...]
    type: Parameter
    repeated: bool = False


_ANY_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")
_ANY_VALUE = Parameter("a value without control characters", re.compile(r"[^\x00-\x1f\x7f]{0,1000}"), "x")


@dataclass(frozen=True, slots=True)
class Query:
    """The typed parameters of a row's query string; :meth:`rebuild` parses a query string against them and
    writes it again from the values it checked. ``open``: any parameter (name of ``[A-Za-z0-9_.-[]]``, value without
    control characters): an operator's pass-through, whose API the proxy does not know."""

    parameters: tuple[QueryParameter, ...] = ()
    open: bool = False
    max_pairs: int = 64
    _by_name: dict[str, QueryParameter] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {name: p for p in self.parameters for name in p.names})

    def rebuild(self, query_string: str) -> str:
        """``query_string`` as the upstream gets it: parsed (``&``-separated, percent-decoded once as UTF-8),
        checked, and encoded again; ``""`` for none. A :class:`QueryProblem` when it holds anything else."""
        if not query_string:
            return ""
        try:
            pairs = parse_qsl(query_string, keep_blank_values=True, strict_parsing=True, errors="strict",
                              max_num_fields=self.max_pairs)
        except (ValueError, UnicodeDecodeError):
            raise QueryProblem("the query string could not be read (at most "
                               f"{self.max_pairs} name=value pairs separated by '&', UTF-8 once decoded)") from None
        seen: set[str] = set()
        for name, value in pairs:
            parameter = self._by_name.get(name)
            if parameter is None:
                if self.open and _ANY_NAME.fullmatch(name) and _ANY_VALUE.accepts(value):
                    continue
                raise QueryProblem(f"Unknown parameter: '{name}'.", name)
            if not parameter.type.accepts(value):
                raise QueryProblem(f"Invalid value for '{name}': expected {parameter.type.what}.", name)
            if parameter.names[0] in seen and not parameter.repeated:
                raise QueryProblem(f"'{name}' may be given once.", name)
            seen.add(parameter.names[0])
        return urlencode(pairs, quote_via=quote, safe="")


NO_QUERY = Query()
"""A row that takes no query parameter."""


@dataclass(frozen=True, slots=True)
class Target:
    """An upstream request's path and query, built from a row (``params``: the path's typed parameters)."""

    path: str
    """What follows the upstream's base URL: the path, and ``?`` and the query when there is one."""
    params: Mapping[str, str]


def upstream_target(template: PathTemplate, query: Query, path: str, query_string: str) -> Target | None:
    """The upstream path and query of a request to decoded ``path`` with ``query_string``, rebuilt from
    ``template`` and ``query``; ``None`` when the path is not the template's (a :class:`QueryProblem` when the
    query is not the row's)."""
    params = template.match(path)
    if params is None:
        return None
    rebuilt = query.rebuild(query_string)
    built = template.build(params)
    return Target(f"{built}?{rebuilt}" if rebuilt else built, params)


class PathAllowList:
    """The requests an operator allows through the generic pass-through: ``"METHOD /path"`` patterns (see the
    module docstring); a pattern's ``*`` segment matches exactly one segment of type :data:`SEGMENT`."""

    OPEN_QUERY = Query(open=True)

    def __init__(self, patterns: list[str]) -> None:
        self._patterns: list[tuple[str, PathTemplate]] = []
        for pattern in patterns:
            method, _, path = pattern.strip().partition(" ")
            self._patterns.append((method.upper(), _template(path.strip())))

    @property
    def patterns(self) -> list[tuple[str, PathTemplate]]:
        """Each allowed ``(method, template)``; ``*`` methods as ``"*"``."""
        return list(self._patterns)

    def target(self, method: str, path: str, query_string: str = "") -> Target | None:
        """The upstream path and query of an allowed request, rebuilt from the pattern it matched; ``None`` when
        no pattern allows it (a :class:`QueryProblem` for a query string that cannot be read)."""
        for allowed_method, template in self._patterns:
            if allowed_method in (method, "*"):
                target = upstream_target(template, self.OPEN_QUERY, path, query_string)
                if target is not None:
                    return target
        return None

    def allows(self, method: str, path: str) -> bool:
        return self.target(method, path) is not None


def _template(path: str) -> PathTemplate:
    """A pass-through pattern's path as a template: its ``*`` segments become typed parameters ``{0}``, ``{1}``..."""
    segments: list[str] = []
    parameters: dict[str, Parameter] = {}
    for segment in path.split("/"):
        if segment == "*":
            name = str(len(parameters))
            parameters[name] = SEGMENT
            segment = "{" + name + "}"
        segments.append(segment)
    return PathTemplate("/".join(segments), parameters)


def check_pattern(pattern: str) -> str:
    """``pattern`` if it is a valid ``"METHOD /path"`` pass-through pattern, else a :class:`ValueError`."""
    method, _, path = pattern.strip().partition(" ")
    path = path.strip()
    if not method or not re.fullmatch(r"[A-Za-z]+|\*", method):
        raise ValueError(f"{pattern!r}: expected 'METHOD /path' (e.g. 'GET /v1/models/*')")
    literal = all(segment == "*" or re.fullmatch(r"[A-Za-z0-9._:@+=-]*", segment) for segment in path.split("/"))
    if not path.startswith("/v1/") or path_problem(path) is not None or not literal or "{" in path:
        raise ValueError(f"{pattern!r}: the path must start with /v1/ and hold segments of letters, digits, ._:@+=- "
                         "or '*', with no dot segments or '//'")
    return f"{method.upper()} {path}"
