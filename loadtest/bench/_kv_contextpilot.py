"""The ContextPilot side of the kv benchmarks: ContextPilot's library mode in the client (it reorders each
request's documents for prefix reuse across requests and writes the prompt, with an importance ranking that keeps
the retrieval rank visible to the model), the requests then sent to the replicas in round-robin, as an app using it
in front of its servers does.

ContextPilot (``pip install contextpilot``, Apache-2.0) is no dependency of this project: the side runs when it can
be imported and is dropped, in one printed line, when not. Its reordering is CPU work in the client, timed per
request (``reorder_ms``)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import time
from collections import Counter
from typing import Any

import httpx

from loadtest.bench._kv_requests import chat_body, post_chat
from loadtest.bench._kv_workload import Workload
from loadtest.goodput import Outcome


def contextpilot_installed() -> bool:
    return importlib.util.find_spec("contextpilot") is not None


class ContextPilotSide:
    """Requests written by ``ContextPilot.optimize`` (one instance, which lives as long as the side's replicas),
    sent to ``urls`` in round-robin."""

    def __init__(self, urls: list[str], work: Workload, client: httpx.AsyncClient) -> None:
        from contextpilot.server.live_index import ContextPilot  # imported only when the side runs

        self.urls, self.work, self.client = urls, work, client
        with contextlib.redirect_stdout(io.StringIO()):  # it says it runs on the CPU
            self.pilot: Any = ContextPilot(use_gpu=False)
        self.statuses: Counter[int] = Counter()
        """Replies other than 200, by status."""
        self.reorder_s: list[float] = []

    async def send(self, index: int) -> Outcome:
        indices, question = self.work.requests[index]
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # it prints a banner per call
            messages = self.pilot.optimize(
                [self.work.documents[j].text for j in indices], question, system_instruction=self.work.system
            )
        self.reorder_s.append(time.perf_counter() - started)
        return await post_chat(
            self.client,
            self.urls[index % len(self.urls)] + "/v1/chat/completions",
            chat_body(messages, self.work.stream),
            self.statuses,
        )

    @property
    def reorder_ms(self) -> float | None:
        """Mean time ContextPilot took to write a request, in milliseconds."""
        return round(sum(self.reorder_s) / len(self.reorder_s) * 1000, 3) if self.reorder_s else None
