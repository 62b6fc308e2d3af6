"""The local backend on a tiny ChatML model with a random LoRA adapter: the openai client
pointed at `serve`, a tool-call round trip, the adapter switch, streaming, bad parameters."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
peft = pytest.importorskip("peft")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tracegym.generation.chat_format import CHATML, ChatFormat  # noqa: E402
from tracegym.generation.tiny_families import tiny_family_policy  # noqa: E402
from tracegym.serving import ConversationRouter, create_app  # noqa: E402
from tracegym.serving.local import Generated, LocalBackend  # noqa: E402
from tracegym.serving.server import running  # noqa: E402

pytestmark = pytest.mark.slow  # builds and runs a (tiny) model
BASE = "tiny-chatml-0"
TOOLS = [{"type": "function", "function": {"name": "refund", "parameters": {
    "type": "object", "properties": {"order": {"type": "integer"}}}}}]  # fmt: skip


def backend(cls=LocalBackend) -> LocalBackend:
    policy = tiny_family_policy(CHATML, 0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(policy.model, config, adapter_name="refund")
    model.eval()
    return cls(model, ChatFormat(policy.tokenizer))


class Scripted(LocalBackend):
    """The real rendering and parsing around a scripted model reply (a random tiny model never
    writes a tool call): records each prompt it was given."""

    prompts: list[str]

    async def generate(self, prompt, model, max_tokens, temperature, on_tokens=None):
        self.prompts = [*getattr(self, "prompts", []), self.tokenizer.decode(prompt)]
        if "tool_call_id" in self.prompts[-1] or "<tool_response>" in self.prompts[-1]:
            text = "Refunded order 7.<|im_end|>"
        else:
            call = {"name": "refund", "arguments": {"order": 7}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if on_tokens is not None:  # streamed token by token, as the engine does
            for token in tokens:
                on_tokens([token])
        return Generated(tokens, text, False)


def test_tool_call_round_trip_with_the_openai_client():
    scripted = backend(Scripted)
    with running(create_app(scripted, ConversationRouter(None, ["refund"], BASE))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "refund order 7"}]
        first = client.chat.completions.create(model="refund", messages=messages, tools=TOOLS)
        assert first.model == "refund" and first.choices[0].finish_reason == "tool_calls"
        (call,) = first.choices[0].message.tool_calls
        assert call.function.name == "refund" and json.loads(call.function.arguments) == {
            "order": 7
        }
        assert "refund" in scripted.prompts[0] and '"order"' in scripted.prompts[0]  # tools shown
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "done: order 7"},
        ]
        second = client.chat.completions.create(model="refund", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == "Refunded order 7."
        assert "done: order 7" in scripted.prompts[1]  # the tool result reached the prompt
        stream = client.chat.completions.create(
            model="refund", messages=messages[:1], tools=TOOLS, stream=True
        )
        chunks = list(stream)
        calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
        assert [t.function.name for t in calls] == ["refund"]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


class Recording(LocalBackend):
    """The real generation, recording which adapter wrote which raw text (a random tiny
    model's replies are mostly whitespace, which parses to no content)."""

    texts: list[tuple[str, str]]

    async def generate(self, prompt, model, max_tokens, temperature, on_tokens=None):
        done = await super().generate(prompt, model, max_tokens, temperature, on_tokens)
        self.texts = [*getattr(self, "texts", []), (model, done.text)]
        return done


def test_the_adapter_and_the_base_model_answer_differently_within_max_tokens():
    real = backend(Recording)
    with running(create_app(real, ConversationRouter(None, ["refund"], BASE))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        asked = [{"role": "user", "content": "hello there"}]
        for model in ("refund", BASE, BASE):
            reply = client.chat.completions.create(model=model, messages=asked, max_tokens=6)
            assert reply.model == model and 1 <= reply.usage.completion_tokens <= 6
        (_, adapted), (_, base), (_, again) = real.texts
        assert [m for m, _ in real.texts] == ["refund", BASE, BASE]
        assert adapted != base  # greedy on the same prompt: only the adapter differs
        assert again == base  # adapters off again after "refund"
        bad = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": BASE, "messages": asked, "max_tokens": 0},
            timeout=30,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        hot = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": BASE, "messages": asked, "temperature": 9},
            timeout=30,
        )
        assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"


def test_serve_builds_on_the_home_and_loads_a_later_promotion(tmp_path):
    """build_local_app (what `tracegym serve` without --upstream runs): the adapters' base
    folder, the promoted adapter loaded; one promoted after the start is loaded before the next
    generation and answers by name."""
    from tracegym.generation.tiny_families import tiny_family_model
    from tracegym.serving.commands import build_local_app, local_folder
    from tracegym.training import adapters

    home = tmp_path / "home"
    folder = tiny_family_model(CHATML, 0, target=tmp_path / "base")
    policy = tiny_family_policy(CHATML, 0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(policy.model, config, adapter_name="press")
    model.add_adapter("refund", config)
    for name, texts in (("press", ["press the button"]), ("refund", ["refund the order"])):
        adapters.save_adapter(
            home, model, name, capability={"env_id": name},
            base_model={"name": BASE, "folder": str(folder)}, data_hash="",
            hyperparameters={}, train_metrics={}, router_texts=texts,
        )  # fmt: skip
    adapters.update_metadata(home, "press", promoted=True)
    assert local_folder(home, None) == folder
    app = build_local_app(home, folder, BASE, embedder="hash", reload_every=0)
    with running(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        asked = [{"role": "user", "content": "press the button please"}]
        first = client.chat.completions.create(model="auto", messages=asked, max_tokens=3)
        assert first.model == "press"
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="refund", messages=asked, max_tokens=3)
        adapters.update_metadata(home, "refund", promoted=True)
        late = client.chat.completions.create(model="refund", messages=asked, max_tokens=3)
        assert late.model == "refund"
        assert [m.id for m in client.models.list()] == [BASE, "press", "refund"]
