"""Per-conversation routing without a server: the LRU map, explicit names, no router."""

from __future__ import annotations

import pytest
from tracegym.serving.protocol import ChatRequest, ServeError, parse_request
from tracegym.serving.routing import ConversationRouter


class CountingChooser:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def choose(self, text: str) -> str | None:
        self.asked.append(text)
        return "a" if "alpha" in text else None


def request(first: str, system: str = "", model: str | None = None) -> ChatRequest:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": first})
    body = {"messages": messages, **({"model": model} if model else {})}
    return ChatRequest(body=body, messages=messages)


def test_each_conversation_asks_the_router_once_and_the_map_is_bounded():
    chooser = CountingChooser()
    router = ConversationRouter(chooser, ["a"], "base", max_conversations=2)
    assert router.decide(request("alpha one")).adapter == "a"
    assert router.decide(request("alpha one")).how == "remembered"
    assert router.decide(request("beta")).adapter is None
    assert chooser.asked == ["alpha one", "beta"]
    router.decide(request("gamma"))  # a third conversation pushes out the oldest
    assert len(router) == 2
    assert router.decide(request("alpha one")).how == "routed"
    assert router.decide(request("gamma")).how == "remembered"


def test_explicit_names_and_unknown_models():
    router = ConversationRouter(CountingChooser(), ["a"], "base")
    assert router.decide(request("alpha", model="base")).adapter is None
    assert router.decide(request("beta", model="a")).adapter == "a"
    with pytest.raises(ServeError) as caught:
        router.decide(request("alpha", model="b"))
    assert caught.value.status == 404 and caught.value.code == "model_not_found"


def test_list_content_parts_count_as_the_first_message():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "alpha"}]}]}
    chat = parse_request(__import__("json").dumps(body).encode())
    assert chat.conversation_key() == ("", "alpha")


@pytest.mark.parametrize(
    "raw, param",
    [
        (b'{"messages": [1]}', "messages[0]"),
        (b'{"messages": [{"content": "x"}]}', "messages[0]"),
        (b'{"messages": [{"role": "user"}], "model": 3}', "model"),
    ],
)
def test_malformed_messages(raw, param):
    with pytest.raises(ServeError) as caught:
        parse_request(raw)
    assert caught.value.param == param and caught.value.status == 400
