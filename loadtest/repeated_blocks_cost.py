"""What recognising repeated blocks adds to reading one long prompt (the figure in normalizer/repeated_blocks.py).

A user message of a header, 5 chunks of 150 words joined by blank lines, rules and a question, its chunks already
counting (the steady state): :meth:`RepeatedBlocks.observe` alone, with the re-registering of what counts (all that
``read_prompt`` adds), and ``read_prompt`` without and with it (the same registry, holding the chunks, either way).
``PYTHONPATH=. python loadtest/repeated_blocks_cost.py``
"""

from __future__ import annotations

import random
import timeit

from normalizer.documents import DocumentRegistry, read_prompt
from normalizer.repeated_blocks import DEFAULT_MAX_BYTES, RepeatedBlocks

WORDS = ("the", "tower", "iron", "paris", "built", "year", "metres", "paint", "lift", "engineer", "fair", "arch",
         "platform", "visitors", "height")


def _prompt(chunks: list[str], question: str) -> dict[str, object]:
    text = "\n\n".join(["Use the following pieces of context to answer the question at the end.", *chunks,
                        "Answer only from the context above; say so when it does not hold the answer.", question])
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def main() -> None:
    rng = random.Random(7)
    chunks = [" ".join(rng.choice(WORDS) for _ in range(150)) for _ in range(5)]
    registry, repeated = DocumentRegistry(), RepeatedBlocks(DEFAULT_MAX_BYTES)
    for n in range(5):  # each chunk at each rank: every one counts
        read_prompt(_prompt(chunks[n:] + chunks[:n], f"Question: number {n}?"), None, registry, repeated)
    body = _prompt(chunks, "Question: when was the tower built?")
    text = body["messages"][0]["content"]  # type: ignore[index]
    assert len(read_prompt(body, None, registry, repeated).documents) == 5
    runs = 2000
    for name, call in (("observe", lambda: repeated.observe(text)),
                       ("extra: observe and re-register", lambda: registry.add_many(repeated.observe(text))),
                       ("read_prompt without", lambda: read_prompt(body, None, registry)),
                       ("read_prompt with", lambda: read_prompt(body, None, registry, repeated))):
        best = min(timeit.repeat(call, number=runs, repeat=5)) / runs
        print(f"{name}: {best * 1e6:.1f} us")


if __name__ == "__main__":
    main()
