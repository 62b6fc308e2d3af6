"""The local backend behind `serve` with the batching engine, through the openai client:
concurrent conversations are batched and answered as each alone, a second turn reuses the cache,
a plain reply streams in several content chunks, bad requests get OpenAI's error shape."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tracegym.generation.chat_format import ChatFormat, template_text  # noqa: E402
from tracegym.generation.model import tiny_model  # noqa: E402
from tracegym.serving import ConversationRouter, create_app  # noqa: E402
from tracegym.serving.local import LocalBackend  # noqa: E402
from tracegym.serving.server import running  # noqa: E402

BASE = "tiny"
SYSTEM = {"role": "system", "content": "You are the shop's agent. Answer briefly."}
ASKS = ["hi", "press the button twice please", "refund order 7", "where is my parcel"]


def backend(slots: int, gather_s: float) -> LocalBackend:
    policy = tiny_model(seed=3)
    fmt = ChatFormat(policy.tokenizer, template_text("chatml"))
    return LocalBackend(policy.model, fmt, slots=slots, gather_s=gather_s)


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_concurrent_conversations_are_batched_and_answered_as_alone():
    # as many slots as conversations and a long gather window: each turn's step starts once
    # every conversation has asked
    served = backend(slots=len(ASKS), gather_s=30.0)
    served.engine.straggler_s = served.engine.max_wait_s = 30.0  # wait for every second turn
    replies: dict[int, list[str]] = {}
    with running(create_app(served, ConversationRouter(None, [], BASE))) as url:
        client = client_for(url)

        def converse(i: int) -> None:
            messages = [SYSTEM, {"role": "user", "content": ASKS[i]}]
            for _ in range(2):
                reply = client.chat.completions.create(model=BASE, messages=messages,
                                                       max_tokens=12)  # fmt: skip
                text = reply.choices[0].message.content or ""
                replies.setdefault(i, []).append(text)
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": "and then?"}]  # fmt: skip

        threads = [threading.Thread(target=converse, args=(i,)) for i in range(len(ASKS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = served.engine.stats
        assert stats.steps == 2 and stats.max_batch == len(ASKS)
        assert stats.rows_per_forward > 1
        assert stats.continued == len(ASKS)  # every second turn continued its slot
        alone = backend(slots=1, gather_s=0.0)
        with running(create_app(alone, ConversationRouter(None, [], BASE))) as single:
            one = client_for(single)
            for i, ask in enumerate(ASKS):
                reply = one.chat.completions.create(
                    model=BASE, messages=[SYSTEM, {"role": "user", "content": ask}], max_tokens=12
                )
                assert (reply.choices[0].message.content or "") == replies[i][0]


def test_a_plain_reply_streams_in_several_content_chunks_before_the_end():
    served = backend(slots=2, gather_s=0.0)
    with running(create_app(served, ConversationRouter(None, [], BASE))) as url:
        client = client_for(url)
        messages = [SYSTEM, {"role": "user", "content": "refund order 7"}]
        whole = client.chat.completions.create(model=BASE, messages=messages, max_tokens=40)
        chunks = list(
            client.chat.completions.create(
                model=BASE, messages=messages, max_tokens=40, stream=True
            )
        )
    contents = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    finish = [i for i, c in enumerate(chunks) if c.choices[0].finish_reason]
    assert len(contents) > 1
    firsts = [i for i, c in enumerate(chunks) if c.choices[0].delta.content]
    assert finish == [len(chunks) - 1] and firsts[1] < finish[0]
    assert "".join(contents) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_bad_requests_get_the_openai_error_shape():
    served = backend(slots=1, gather_s=0.0)
    with running(create_app(served, ConversationRouter(None, [], BASE))) as url:
        target = f"{url}/v1/chat/completions"
        asked = [{"role": "user", "content": "hi"}]
        for body, param in (
            ({"model": BASE, "messages": asked, "max_tokens": 0}, "max_tokens"),
            ({"model": BASE, "messages": asked, "temperature": "hot"}, "temperature"),
            ({"model": BASE, "messages": asked, "stream": True, "max_tokens": -1}, "max_tokens"),
            ({"model": BASE, "messages": []}, "messages"),
        ):
            answer = httpx.post(target, json=body, timeout=30)
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["param"] == param and error["type"] == "invalid_request_error"
