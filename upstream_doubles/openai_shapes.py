"""OpenAI wire-format bodies, as the official ``openai`` SDK parses them (pure functions, no I/O).

Deterministic content: the default answer and the embeddings derive from a hash of the input, so tests can
compute the expected output themselves (:func:`default_answer`, :func:`embedding_vector`).
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

FINGERPRINT = "fp_fakellm"


def prompt_of_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """The chat transcript flattened to text, one ``role: content`` line per message (text parts only)."""
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part
            )
        lines.append(f"{message.get('role', 'user')}: {content or ''}")
    return "\n".join(lines)


def default_answer(prompt: str) -> str:
    """``answer <12 hex digits of sha256(prompt)>`` followed by up to the prompt's last 8 words."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return " ".join(["answer", digest, *prompt.split()[-8:]])


def split_answer(answer: str, max_tokens: int | None) -> tuple[list[str], str]:
    """The answer as streamable pieces (one per word, with its leading space) and the finish reason."""
    words = answer.split(" ")
    pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
    if max_tokens is not None and len(pieces) > max_tokens:
        return pieces[:max_tokens], "length"
    return pieces, "stop"


def count_tokens(text: str) -> int:
    return len(text.split())


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _envelope(kind: str, completion_id: str, model: str, created: int | None) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": kind,
        "created": created if created is not None else int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def chat_completion(
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str,
    use: dict[str, Any],
    created: int | None = None,
) -> dict[str, Any]:
    body = _envelope("chat.completion", completion_id, model, created)
    body["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    ]
    body["usage"] = use
    return body


def chat_chunk(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    use: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``delta=None`` makes the final usage-only chunk (no choices)."""
    body = _envelope("chat.completion.chunk", completion_id, model, created)
    if delta is None:
        body["choices"] = []
        body["usage"] = use
    else:
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    return body


def text_completion(
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str,
    use: dict[str, Any],
    created: int | None = None,
) -> dict[str, Any]:
    body = _envelope("text_completion", completion_id, model, created)
    body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body["usage"] = use
    return body


def text_chunk(
    completion_id: str,
    model: str,
    created: int,
    text: str | None,
    finish_reason: str | None = None,
    use: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streamed ``text_completion``; ``text=None`` makes the final usage-only chunk."""
    body = _envelope("text_completion", completion_id, model, created)
    if text is None:
        body["choices"] = []
        body["usage"] = use
    else:
        body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    return body


def embedding_vector(item: str | list[int], dimensions: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A unit vector of ``dimensions`` float32s seeded by sha256 of the input (text, or token ids)."""
    raw = item.encode() if isinstance(item, str) else b",".join(str(t).encode() for t in item)
    seed = int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm else vector


def embedding_inputs(value: Any) -> list[str | list[int]]:
    """OpenAI's ``input``: a string, a list of strings, a token list or a list of token lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [list(value)]
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        return [v if isinstance(v, str) else [int(t) for t in v] for v in value]
    raise ValueError("'input' must be a non-empty string, array of strings, or array of token arrays")


def embeddings(
    model: str, inputs: list[str | list[int]], dimensions: int, encoding_format: str
) -> dict[str, Any]:
    data = []
    prompt_tokens = 0
    for index, item in enumerate(inputs):
        vector = embedding_vector(item, dimensions)
        encoded: Any = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode()
            if encoding_format == "base64"
            else [float(x) for x in vector]
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
        prompt_tokens += count_tokens(item) if isinstance(item, str) else len(item)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_list(models: list[str], created: int = 1_700_000_000) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(m, created) for m in models]}


def model_card(model: str, created: int = 1_700_000_000) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "fakellm"}


def error_body(
    message: str, error_type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}
