"""``ragproxy demo``: the proxy in front of two built-in TEST upstreams, a short tour that shows each cache tier
at work, then exit 0 (1 when a step did not get the cache status it should); ``--serve`` keeps everything running
for the newcomer's own requests and prints curl lines to try.

The upstreams are the test doubles the tests use, named as such wherever they show: ``FakeLLM``
(:mod:`upstream_doubles.llm_server`) with the demo's canned answers (:class:`~commands.demo.tour.DemoAnswers`), and
``QdrantShim`` (:mod:`upstream_doubles.qdrant_shim`, Qdrant's REST API over qdrant-client's local mode). They listen
on sockets bound before the settings are built, so their addresses are known and cannot be taken in between. The proxy
runs as ``serve`` runs it (:func:`commands.serve.running`), in a temporary data directory (every run starts
cold), on
free ports, or on the configured ports (8080 and 8081 by default) with ``--serve``; with one difference, said in
its output: L2 runs at a fixed threshold (see ``_DEFAULTS``), since a calibrated one serves no semantic hit on a
first run.
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import dataclass
from typing import Any

from commands.demo.tour import MODEL, DemoAnswers, Tour, curl_lines
from commands.serve import running, stop_signal
from proxy.assembly.config import Settings
from proxy.assembly.startup_report import gather, http_url, render
from proxy.cache_tiers.semantic import SemanticCacheTier
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim

_DEFAULTS: dict[str, Any] = {
    "logging.format": "text", "logging.level": "warning",
    # L2's default threshold is calibrated per namespace from answer comparisons and serves no semantic hit before
    # the evidence meets its error bound; a first run has none, so the demo fixes the threshold and verifies no hits
    "cache.l2.threshold": 0.8, "cache.l2.verify_fraction": 0.0,
}
INTRO = ("ragproxy demo: the proxy in front of two TEST upstreams built into ragproxy, not real services:\n"
         "a canned OpenAI-compatible LLM, and a Qdrant double over qdrant-client's local mode. The demo fixes\n"
         "L2's threshold at 0.8 (cache.l2.threshold); by default it is calibrated per namespace from answer\n"
         "comparisons, and semantic hits start once they meet cache.l2.max_wrong_hit_rate.\n")


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Demo:
    overrides: dict[str, Any]
    """The proxy's settings: the command line's, over the demo's defaults, under its upstreams and data directory."""
    keep_serving: bool
    sockets: tuple[socket.socket, socket.socket]
    data_dir: tempfile.TemporaryDirectory[str]

    @classmethod
    def prepare(cls, overrides: dict[str, Any], *, keep_serving: bool) -> Demo:
        """Bind the doubles' sockets and work out the proxy's settings."""
        llm, qdrant = _bound(), _bound()
        data_dir = tempfile.TemporaryDirectory(prefix="ragproxy-demo-")
        ports = {} if keep_serving else {"server.port": _free_port(), "admin.port": _free_port()}
        own = {"upstreams.llm": [{"url": http_url(*llm.getsockname())}],
               "upstreams.qdrant.url": http_url(*qdrant.getsockname()), "data_dir": data_dir.name}
        return cls({**_DEFAULTS, **ports, **overrides, **own}, keep_serving, (llm, qdrant), data_dir)

    async def run(self, settings: Settings) -> int:
        llm_socket, qdrant_socket = self.sockets
        passed = False
        try:
            async with FakeLLM(model=MODEL, answer=DemoAnswers(), sock=llm_socket) as llm, \
                    QdrantShim(sock=qdrant_socket) as qdrant, running(settings) as runtime:
                # before anything is printed: a signal sent once the output says so must find its handler
                stop = stop_signal() if self.keep_serving else None
                semantic = runtime.tiers.find(SemanticCacheTier)
                if semantic is not None and semantic.ready is not None:
                    await semantic.ready  # the embedding model is loaded in the background
                print(INTRO)
                report = await gather(settings, runtime)
                print(render(report))
                tour = Tour(settings, semantic, llm.log, qdrant.log)
                passed = await tour.run(runtime.client, report.features["L2 semantic"])
                if stop is not None:
                    print("\nTry it yourself: the proxy and its test upstreams keep running (Ctrl-C stops them)\n")
                    print("\n".join(curl_lines(settings, tour.api_key)), flush=True)
                    await stop.wait()
        finally:
            self.data_dir.cleanup()
        return 0 if passed else 1
