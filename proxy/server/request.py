"""One client request as the data plane sees it: head and complete body, parsed once by the server."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote

from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

_EMPTY_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class Request:
    """A request whose body the server has read (up to the configured limit).

    ``raw_path`` is the origin-form target as the client sent it (percent-encoding kept, query included; an
    absolute-form target ``http://host/p?q`` is reduced to ``/p?q``): it is what goes upstream. ``path`` is its
    percent-decoded path, for routing. ``body_too_large`` says the body passed the limit: ``body`` is then empty
    and the handler answers 413.
    """

    __slots__ = (
        "_query",
        "body",
        "body_too_large",
        "headers",
        "host",
        "method",
        "path",
        "peer",
        "query_string",
        "raw_path",
    )
    scheme = "http"  # the data plane listens without TLS

    def __init__(self, method: str, target: str, headers: CIMultiDictProxy[str] | None = None, body: bytes = b"",
                 *, peer: str | None = None, body_too_large: bool = False) -> None:
        self.method = method
        if not target.startswith("/"):  # absolute form (or "*"): keep the path and query only
            rest = target.split("://", 1)[-1]
            slash = rest.find("/")
            target = rest[slash:] if slash >= 0 else "/"
        self.raw_path = target
        raw, _, self.query_string = target.partition("?")
        self.path = unquote(raw) if "%" in raw else raw
        self.headers = headers if headers is not None else _EMPTY_HEADERS
        self.body = body
        self.peer = peer
        self.host: str | None = self.headers.get("Host")
        self.body_too_large = body_too_large
        self._query: MultiDictProxy[str] | None = None

    @property
    def path_qs(self) -> str:
        """The decoded path followed by the query as sent."""
        return f"{self.path}?{self.query_string}" if self.query_string else self.path

    @property
    def query(self) -> MultiDictProxy[str]:
        """The query's parameters, decoded (parsed on first use)."""
        if self._query is None:
            self._query = MultiDictProxy(MultiDict(parse_qsl(self.query_string, keep_blank_values=True)))
        return self._query

    @property
    def content_type(self) -> str:
        """The body's media type, lower-cased, without parameters (``application/octet-stream`` when absent)."""
        value = self.headers.get("Content-Type")
        if value is None:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()
