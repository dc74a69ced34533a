"""``python -m loadtest.simulate TRACE ...``: ``ragproxy simulate`` (:mod:`tiers.policies.simulate`), where TRACE may
also name a generator of :mod:`loadtest.traces` (then ``--requests`` and ``--seed`` apply)."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.traces import GENERATORS
from tiers.policies.simulate import main as simulate


def main(argv: Sequence[str] | None = None) -> int:
    return simulate(argv, GENERATORS)


if __name__ == "__main__":
    raise SystemExit(main())
