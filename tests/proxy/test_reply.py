"""Reply end and finish callbacks: order, once only, and moving to a reply that answers instead."""

from __future__ import annotations

from proxy.core.context import Reply


async def test_end_callbacks_run_inline_once_and_before_finish_callbacks() -> None:
    events: list[str] = []
    reply = Reply(200, body=b"{}")

    async def store(_reply: Reply, ok: bool, body: bytes) -> None:
        events.append(f"finish ok={ok} body={body!r}")

    reply.on_end(lambda _reply, ok: events.append(f"end ok={ok}"))
    reply.on_finish(store)
    assert reply.wants_body, "a finish callback needs the body"
    reply.end(True)
    assert events == ["end ok=True"]
    await reply.finish(True, b"{}")
    assert events == ["end ok=True", "finish ok=True body=b'{}'"], "end callbacks run once"


def test_a_reply_with_only_end_callbacks_does_not_want_its_body() -> None:
    reply = Reply(200, body=b"{}")
    reply.on_end(lambda _reply, _ok: None)
    assert not reply.wants_body


async def test_take_over_moves_end_callbacks_to_the_reply_that_answers() -> None:
    released: list[bool] = []
    upstream = Reply(200, body=b"upstream")
    upstream.on_end(lambda _reply, ok: released.append(ok))
    answer = Reply(200, body=b"merged").take_over(upstream)
    upstream.end(True)
    assert released == []
    await answer.finish(False, b"")
    assert released == [False]
