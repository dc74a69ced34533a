"""Pytest fixtures for the upstream doubles.

Use them with ``pytest_plugins = ["tests.support.doubles_fixtures"]`` in the
root conftest, or import the names into a package's ``conftest.py``.

- ``fake_llm``: a running :class:`FakeLLM` on the test's event loop (async tests);
- ``fake_llm_thread``: a running :class:`FakeLLM` on a background thread (sync tests, sync SDK clients);
- ``qdrant_shim``: a running TEST-ONLY :class:`QdrantShim` on a background thread (usable from sync and async
  tests, since its handlers never wait).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.qdrant_shim import QdrantShim


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as llm:
        yield llm


@pytest.fixture
def fake_llm_thread() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.fixture
def qdrant_shim() -> Iterator[QdrantShim]:
    with QdrantShim() as shim:
        yield shim
