"""Adapters promoted after `serve` started answer without a restart: promote, then request."""

from __future__ import annotations

import pytest

pytest.importorskip("numpy")
httpx = pytest.importorskip("httpx")

from tracegym.serving.commands import build_app  # noqa: E402
from tracegym.serving.protocol import ChatRequest  # noqa: E402
from tracegym.serving.routing import ConversationRouter, RegistryWatch, registry_router  # noqa: E402
from tracegym.serving.server import running  # noqa: E402
from tracegym.training.adapters import update_metadata  # noqa: E402

from tests.serving.fakes import BASE, FakeUpstream, adapter_home  # noqa: E402

ONLY_PRESS = {
    "press": (True, ["press the red button", "please press the blue button", "button panel"]),
    "refund": (False, ["refund the order", "issue a refund for order", "refund money to customer"]),
}


def ask(url: str, first: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": first}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_a_promotion_is_served_on_the_next_request(tmp_path):
    home = adapter_home(tmp_path, ONLY_PRESS)
    fake = FakeUpstream()
    with running(fake.app()) as upstream:
        app = build_app(home, f"{upstream}/v1", BASE, embedder="hash", reload_every=0)
        with running(app) as url:
            assert ask(url, "issue a refund for order 7").json()["model"] == BASE
            pressing = ask(url, "please press the green button")
            assert pressing.json()["model"] == "press"
            update_metadata(home, "refund", promoted=True)
            ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
            assert ids == [BASE, "press", "refund"]
            assert ask(url, "issue a refund for order 8").json()["model"] == "refund"
            # a conversation already on the base model stays there
            assert ask(url, "issue a refund for order 7").json()["model"] == BASE
            update_metadata(home, "press", promoted=False)
            again = ask(url, "please press the green button")  # its adapter is gone: re-routed
            assert again.json()["model"] != "press"
            assert again.headers["x-tracegym-routing"] == "routed"
    assert [b["model"] for b in fake.received] == [
        BASE,
        "press",
        "refund",
        BASE,
        again.json()["model"],
    ]


def test_the_registry_is_looked_at_no_more_than_every_n_seconds(tmp_path):
    home = adapter_home(tmp_path, ONLY_PRESS)
    now = [100.0]
    watch = RegistryWatch(home, "hash", every=5.0, clock=lambda: now[0])
    router = ConversationRouter(*registry_router(home, "hash"), BASE, reload=watch)

    def decide(text: str):
        messages = [{"role": "user", "content": text}]
        return router.decide(ChatRequest(body={"messages": messages}, messages=messages))

    assert decide("a").adapter is None  # the first look: nothing changed
    update_metadata(home, "refund", promoted=True)
    now[0] += 4.0
    assert decide("issue a refund for order 1").adapter is None  # not looked at yet
    now[0] += 1.0
    assert decide("issue a refund for order 2").adapter == "refund"
    assert watch() is None  # nothing changed since
