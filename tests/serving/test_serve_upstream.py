"""`tracegym serve` in front of a fake multi-LoRA upstream on loopback: routing once per
conversation, explicit adapters, the `model` field, streaming, and errors in OpenAI's shape."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from tracegym.serving import ConversationRouter, UpstreamBackend, create_app  # noqa: E402
from tracegym.serving.commands import build_app  # noqa: E402
from tracegym.serving.server import running  # noqa: E402

from tests.serving.fakes import BASE, FakeUpstream, adapter_home, completion  # noqa: E402


@pytest.fixture
def upstream():
    fake = FakeUpstream()
    with running(fake.app()) as url:
        fake.url = f"{url}/v1"
        yield fake


@pytest.fixture
def serve(tmp_path, upstream):
    home = adapter_home(tmp_path)
    with running(build_app(home, upstream.url, BASE, embedder="hash")) as url:
        yield f"{url}/v1"


def post(url: str, body: object, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, timeout=30, **kwargs)


def turn(first: str, *later: dict, system: str = "You run the shop.") -> dict:
    return {
        "model": "auto",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": first},
            *later,
        ],
    }


def test_models_lists_the_base_and_promoted_adapters_only(serve):
    ids = [m["id"] for m in httpx.get(f"{serve}/models").json()["data"]]
    assert ids == [BASE, "press", "refund"]  # `draft` is not promoted


def test_a_conversation_is_routed_once_and_keeps_its_adapter(serve, upstream):
    first = post(serve, turn("please press the green button"))
    assert first.status_code == 200, first.text
    assert first.json()["model"] == "press"  # says which adapter answered, not upstream's name
    assert first.headers["x-tracegym-routing"] == "routed"
    assert upstream.received[-1]["model"] == "press"
    later = turn(
        "please press the green button",
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "press", "arguments": "{\"color\": \"green\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "pressed"},
        {"role": "user", "content": "now refund the order and issue a refund"},
    )  # fmt: skip
    second = post(serve, later)
    assert second.json()["model"] == "press"  # the later turn talks of refunds: same adapter
    assert second.headers["x-tracegym-routing"] == "remembered"
    assert upstream.received[-1]["model"] == "press"
    # the rest of the request reaches the upstream unchanged
    assert upstream.received[-1]["messages"] == later["messages"]
    other = post(serve, turn("issue a refund for order 7"))
    assert other.json()["model"] == "refund" and upstream.received[-1]["model"] == "refund"
    # the same first message under another system prompt is another conversation
    again = post(serve, turn("please press the green button", system="Another agent."))
    assert again.headers["x-tracegym-routing"] == "routed"


def test_nothing_close_goes_to_the_base_model(serve, upstream):
    reply = post(serve, turn("zebra quantum lattice"))
    assert reply.json()["model"] == BASE and upstream.received[-1]["model"] == BASE


def test_an_explicit_model_is_not_routed(serve, upstream):
    body = {**turn("please press the green button"), "model": "refund", "max_tokens": 7,
            "temperature": 0.3, "tools": [{"type": "function", "function": {"name": "refund",
            "parameters": {"type": "object", "properties": {}}}}]}  # fmt: skip
    reply = post(serve, body)
    assert reply.json()["model"] == "refund"
    assert reply.headers["x-tracegym-routing"] == "explicit"
    sent = upstream.received[-1]
    assert (sent["model"], sent["max_tokens"], sent["temperature"]) == ("refund", 7, 0.3)
    assert sent["tools"] == body["tools"]
    assert post(serve, {**body, "model": BASE}).json()["model"] == BASE


def test_streaming_is_passed_through_in_the_openai_chunk_shape(serve, upstream):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=serve, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "please press the green button"}],
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello press"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert upstream.received[-1]["stream"] is True


def test_a_tool_call_round_trip_with_the_openai_client(serve, upstream):
    openai = pytest.importorskip("openai")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "refund", "arguments": "{\"order\": 7}"}}  # fmt: skip
    upstream.reply = lambda body: (
        completion(body["model"], None, [call])
        if body["messages"][-1]["role"] == "user"
        else completion(body["model"], "Refunded order 7.")
    )
    client = openai.OpenAI(base_url=serve, api_key="unused", max_retries=0)
    tools = [{"type": "function", "function": {"name": "refund", "parameters": {
        "type": "object", "properties": {"order": {"type": "integer"}}}}}]  # fmt: skip
    messages = [{"role": "user", "content": "issue a refund for order 7"}]
    first = client.chat.completions.create(model="auto", messages=messages, tools=tools)
    assert first.model == "refund"
    (tool_call,) = first.choices[0].message.tool_calls
    assert tool_call.function.name == "refund" and json.loads(tool_call.function.arguments) == {
        "order": 7
    }
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "ok"},
    ]
    second = client.chat.completions.create(model="auto", messages=messages, tools=tools)
    assert second.choices[0].message.content == "Refunded order 7." and second.model == "refund"
    assert upstream.received[-1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "ok",
    }


def _error(reply: httpx.Response) -> dict:
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_bad_requests_get_the_openai_error_shape(serve, upstream):
    bad_json = httpx.post(f"{serve}/chat/completions", content=b"{not json", timeout=30)
    assert bad_json.status_code == 400 and _error(bad_json)["code"] == "invalid_json"
    not_object = post(serve, [1, 2])
    assert not_object.status_code == 400 and _error(not_object)["code"] == "invalid_json"
    missing = post(serve, {"model": "auto"})
    assert missing.status_code == 400 and _error(missing)["param"] == "messages"
    empty = post(serve, {"messages": []})
    assert empty.status_code == 400 and _error(empty)["param"] == "messages"
    unknown = post(serve, {**turn("hi"), "model": "nope"})
    assert unknown.status_code == 404 and _error(unknown)["code"] == "model_not_found"
    unpromoted = post(serve, {**turn("hi"), "model": "draft"})
    assert unpromoted.status_code == 404
    huge = post(serve, turn("x" * (5 * 1024 * 1024)))
    assert huge.status_code == 413 and _error(huge)["code"] == "request_too_large"
    wrong_path = httpx.get(f"{serve}/nothing")
    assert wrong_path.status_code == 404 and _error(wrong_path)
    wrong_method = httpx.get(f"{serve}/chat/completions")
    assert wrong_method.status_code == 405 and _error(wrong_method)
    assert upstream.received == []  # none of them reached the upstream


def test_a_chunked_body_over_the_limit_is_refused(tmp_path, upstream):
    router = ConversationRouter(None, [], BASE)
    app = create_app(UpstreamBackend(upstream.url), router, max_body_bytes=100)

    def body():
        yield b'{"messages": [{"role": "user", "content": "'
        yield b"x" * 200
        yield b'"}]}'

    with running(app) as url:
        reply = httpx.post(f"{url}/v1/chat/completions", content=body(), timeout=30)
    assert reply.status_code == 413 and _error(reply)["code"] == "request_too_large"
    assert upstream.received == []


def test_upstream_errors_keep_their_status_and_message(tmp_path, upstream):
    router = ConversationRouter(None, ["broken"], BASE)
    with running(create_app(UpstreamBackend(upstream.url), router)) as url:
        reply = post(f"{url}/v1", {**turn("hi"), "model": "broken"})
    assert reply.status_code == 404
    assert "does not exist" in _error(reply)["message"]


def test_an_unreachable_upstream_is_a_502(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        router = ConversationRouter(None, [], BASE)
        with running(create_app(UpstreamBackend(dead), router)) as url:
            reply = post(f"{url}/v1", turn("hi"))
    assert reply.status_code == 502 and _error(reply)["code"] == "upstream_unreachable"


def test_the_api_key_is_sent_to_the_upstream(tmp_path, upstream):
    router = ConversationRouter(None, [], BASE)
    with running(create_app(UpstreamBackend(upstream.url, api_key="s3cret"), router)) as url:
        assert post(f"{url}/v1", turn("hi")).status_code == 200
    assert upstream.headers[-1]["authorization"] == "Bearer s3cret"
