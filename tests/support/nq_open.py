"""NQ-open's development questions for the tests that need real text: read from ``../shared/data`` beside the checkout
(not redistributed with the project); those tests skip, with the reason, where it is not there."""

from __future__ import annotations

import pytest

from loadtest.responses import DEFAULT_QUESTIONS

needs_nq_open = pytest.mark.skipif(not DEFAULT_QUESTIONS.exists(),
                                   reason=f"{DEFAULT_QUESTIONS} is not beside the checkout")
