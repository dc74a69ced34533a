"""Realistic OpenAI ``chat.completion`` responses for benchmarks and compression training.

The message contents are built from real English text: the questions and answers of Natural Questions (open
domain, dev split), read from a JSON-lines file (``{"question": ..., "answer": [...]}`` per line) at
generation time only. The default path is ``../shared/data/nq_open_dev.jsonl`` beside the checkout (not
redistributed with the project).

The mix (one ``ResponseGenerator`` per seed, fully deterministic):

- length: 30 % short (one sentence), 50 % medium (2-6 sentences), 20 % long (8-24 sentences, markdown lists
  sometimes), every sentence built from a different question/answer pair;
- models: hosted (``gpt-4o-mini``, ``gpt-4o``) and self-hosted (``meta-llama/Llama-3.1-8B-Instruct``,
  ``Qwen/Qwen2.5-7B-Instruct``) with their differing field sets (``system_fingerprint``, ``refusal``, token
  details);
- 5 % end with ``finish_reason: "length"``; ids, ``created`` and token counts vary per response.

Bodies are serialized compactly (no indentation), the conservative choice for compression figures. ``chunks``
gives the same answer in the streamed ``chat.completion.chunk`` form and ``sse`` its wire bytes.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "nq_open_dev.jsonl"
"""NQ-open's development questions, read where the development data lies beside the checkout (``../shared/data``;
not redistributed with the project); ``--questions`` names another copy."""

_MODELS = (
    ("gpt-4o-mini-2024-07-18", True),
    ("gpt-4o-2024-08-06", True),
    ("meta-llama/Llama-3.1-8B-Instruct", False),
    ("Qwen/Qwen2.5-7B-Instruct", False),
)
_OPENERS = (
    "",
    "Based on the provided context, ",
    "According to the documents, ",
    "Short answer: ",
    "From the retrieved passages, ",
)
_STATEMENTS = (
    "{q}? {a}.",
    'The answer to "{q}" is {a}.',
    "{a} is the answer when asking {q}.",
    "If you are wondering {q}, the sources say {a}.",
    "Regarding {q}: {a}.",
)
_CLOSERS = (
    "",
    " Let me know if you need more detail.",
    " I hope this helps!",
    " Sources may differ on the exact details.",
)


@dataclass(frozen=True, slots=True)
class QA:
    """One question with its accepted answers."""

    question: str
    answers: tuple[str, ...]


def load_questions(path: Path | str = DEFAULT_QUESTIONS) -> list[QA]:
    """Question/answer pairs from a Natural Questions JSON-lines file."""
    pairs: list[QA] = []
    with Path(path).open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                pairs.append(QA(str(row["question"]), tuple(str(a) for a in row.get("answer", ()))))
    if not pairs:
        raise ValueError(f"no questions in {path}")
    return pairs


class ResponseGenerator:
    """Seeded source of OpenAI-shaped chat completions (dicts, bytes, chunks, SSE)."""

    def __init__(self, questions: Path | str | list[QA] = DEFAULT_QUESTIONS, seed: int = 0) -> None:
        self.pairs = questions if isinstance(questions, list) else load_questions(questions)
        self._rng = random.Random(seed)
        self._created = 1_730_000_000 + self._rng.randrange(10_000_000)

    def _token(self, length: int) -> str:
        alphabet = string.ascii_letters + string.digits
        return "".join(self._rng.choice(alphabet) for _ in range(length))

    def _sentence(self) -> str:
        pair = self._rng.choice(self.pairs)
        answer = self._rng.choice(pair.answers) if pair.answers else "unknown"
        template = self._rng.choice(_STATEMENTS)
        text = template.format(q=pair.question, a=answer)
        return text[0].upper() + text[1:]

    def content(self) -> str:
        """An assistant answer of the mix's length distribution."""
        roll = self._rng.random()
        if roll < 0.3:
            count = 1
        elif roll < 0.8:
            count = self._rng.randint(2, 6)
        else:
            count = self._rng.randint(8, 24)
        sentences = [self._sentence() for _ in range(count)]
        if count >= 8 and self._rng.random() < 0.5:
            body = sentences[0] + "\n\n" + "\n".join(f"{i}. {s}" for i, s in enumerate(sentences[1:], 1))
        else:
            body = " ".join(sentences)
        return self._rng.choice(_OPENERS) + body + self._rng.choice(_CLOSERS)

    def completion(self) -> dict[str, Any]:
        """One ``chat.completion`` object."""
        model, hosted = self._rng.choice(_MODELS)
        self._created += self._rng.randrange(1, 30)
        content = self.content()
        completion_tokens = max(1, len(content) // 4 + self._rng.randrange(-3, 4))
        prompt_tokens = self._rng.randrange(40, 3000)
        finish = "length" if self._rng.random() < 0.05 else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": content}
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        body: dict[str, Any] = {
            "id": "chatcmpl-" + (self._token(29) if hosted else self._token(32).lower()),
            "object": "chat.completion",
            "created": self._created,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }
        if hosted:
            message["refusal"] = None
            cached = self._rng.choice((0, 0, 1024, 1536, 2048)) if prompt_tokens > 1024 else 0
            usage["prompt_tokens_details"] = {"cached_tokens": min(cached, prompt_tokens), "audio_tokens": 0}
            usage["completion_tokens_details"] = {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            }
            body["service_tier"] = "default"
            body["system_fingerprint"] = "fp_" + self._token(10).lower()
        else:
            message["tool_calls"] = []
            body["choices"][0]["stop_reason"] = None
            body["prompt_logprobs"] = None
        return body

    def completion_bytes(self) -> bytes:
        """One completion as compact JSON bytes (what an upstream sends)."""
        return json.dumps(self.completion(), separators=(",", ":"), ensure_ascii=False).encode()

    def many(self, count: int) -> Iterator[bytes]:
        """``count`` completions as bytes."""
        for _ in range(count):
            yield self.completion_bytes()

    def chunks(self, completion: dict[str, Any] | None = None, words_per_chunk: int = 3) -> list[dict[str, Any]]:
        """``completion`` (a new one if omitted) as streamed chunks: role, content, finish, usage."""
        body = completion if completion is not None else self.completion()
        choice = body["choices"][0]
        base = {
            "id": body["id"],
            "object": "chat.completion.chunk",
            "created": body["created"],
            "model": body["model"],
        }
        if "system_fingerprint" in body:
            base["system_fingerprint"] = body["system_fingerprint"]

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            part = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [part]}

        out = [chunk({"role": "assistant", "content": ""}, None)]
        words = choice["message"]["content"].split(" ")
        for start in range(0, len(words), words_per_chunk):
            piece = " ".join(words[start : start + words_per_chunk])
            out.append(chunk({"content": piece if start == 0 else " " + piece}, None))
        out.append(chunk({}, choice["finish_reason"]))
        out.append({**base, "choices": [], "usage": body["usage"]})
        return out

    def sse(self, completion: dict[str, Any] | None = None) -> bytes:
        """Wire bytes of the streamed form, ending with ``data: [DONE]``."""
        lines = [
            f"data: {json.dumps(c, separators=(',', ':'), ensure_ascii=False)}\n\n" for c in self.chunks(completion)
        ]
        return ("".join(lines) + "data: [DONE]\n\n").encode()
