"""ChatFormat: each family's template renders OpenAI-shaped conversations, a tiny model of the
family generates from the prompt, and replies parse back (never raising on what a model wrote)."""

from __future__ import annotations

import json

import pytest
import torch
from tracegym.generation.chat_format import (
    CHATML,
    FAMILIES,
    LLAMA3,
    MISTRAL,
    ChatFormat,
    Reply,
    ToolCall,
    family_of,
    mistral_call_id,
    parse_any,
    supports_tools,
    template_text,
)
from tracegym.generation.model import tiny_tokenizer
from tracegym.generation.tiny_families import tiny_family_model, tiny_family_policy

from tests.fixtures.chatml_ids import PLAIN_CHATML

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find an order.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Where is A-12?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"id": "A-12"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc", "content": "shipped"},
]


@pytest.fixture(scope="module", params=FAMILIES)
def policy(request):
    return tiny_family_policy(request.param, seed=0)


def test_family_detected_from_template(policy) -> None:
    fmt = ChatFormat(policy.tokenizer)
    assert fmt.family == policy.name.split("-")[1]
    assert family_of(PLAIN_CHATML) == CHATML
    assert family_of("no markers here") == "unknown"


def test_round_trip_render_generate_parse(policy) -> None:
    fmt = ChatFormat(policy.tokenizer)
    prompt = fmt.render(CONVERSATION, tools=TOOLS)
    assert "lookup" in prompt and "Where is A-12?" in prompt and "shipped" in prompt
    assert '"id": "A-12"' in prompt  # arguments rendered as a JSON object, not a quoted string
    ids = fmt.render_ids(CONVERSATION, tools=TOOLS)
    assert policy.tokenizer.decode(ids) == prompt
    out = policy.model.generate(
        torch.tensor([ids]),
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=policy.tokenizer.pad_token_id,
    )
    text = policy.tokenizer.decode(out[0][len(ids) :], skip_special_tokens=False)
    reply = fmt.parse_reply(text)
    assert isinstance(reply, Reply)
    assert reply.tool_calls == []  # random weights write no valid call


def test_rendered_tool_call_parses_back(policy) -> None:
    """The assistant turn the template writes for a call is read back as that call."""
    fmt = ChatFormat(policy.tokenizer)
    before = fmt.render(CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True)
    after = fmt.render(CONVERSATION[:3], tools=TOOLS, add_generation_prompt=False)
    assert after.startswith(before)
    reply = fmt.parse_reply(after[len(before) :])
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("lookup", {"id": "A-12"})]


def test_supports_tools() -> None:
    for family in FAMILIES:
        assert supports_tools(tiny_family_policy(family).tokenizer)
    plain = tiny_tokenizer()
    plain.chat_template = PLAIN_CHATML
    assert not supports_tools(plain)
    assert supports_tools(plain, chat_template=template_text(CHATML))


def test_mistral_ids_are_nine_alphanumerics_and_consistent() -> None:
    fmt = ChatFormat(tiny_family_policy(MISTRAL).tokenizer)
    prompt = fmt.render(CONVERSATION, tools=TOOLS)
    short = mistral_call_id("call_abc")
    assert len(short) == 9 and short.isalnum()
    assert prompt.count(short) == 2  # the call and its result carry the same id
    assert mistral_call_id("abcdefghi") == "abcdefghi"


def test_tiny_family_model_folder(tmp_path) -> None:
    folder = tiny_family_model(LLAMA3, 1, target=tmp_path / "llama3")
    fmt = ChatFormat.from_folder(folder)
    assert fmt.family == LLAMA3
    assert supports_tools(fmt.tokenizer)


# Known-good replies per family -----------------------------------------------------------------
CALL = ToolCall("lookup", {"id": "A-12"})
CALL2 = ToolCall("press", {"color": "red"})
HERMES = {
    "one": '<tool_call>\n{"name": "lookup", "arguments": {"id": "A-12"}}\n</tool_call><|im_end|>',
    "two": '<tool_call>{"name": "lookup", "arguments": {"id": "A-12"}}</tool_call>\n'
    '<tool_call>{"name": "press", "arguments": {"color": "red"}}</tool_call>',
    "text": "The order is shipped.<|im_end|>",
    "bad": '<tool_call>{"name": "lookup", "arguments": {"id": </tool_call>',
}
LLAMA = {
    "one": '{"name": "lookup", "parameters": {"id": "A-12"}}<|eot_id|>',
    "two": '<|python_tag|>{"name": "lookup", "parameters": {"id": "A-12"}}; '
    '{"name": "press", "parameters": {"color": "red"}}<|eom_id|>',
    "text": "The order is shipped.<|eot_id|>",
    "bad": '{"name": "lookup", "parameters": {"id": "A-1',
}
MISTRAL_REPLIES = {
    "one": '[TOOL_CALLS][{"name": "lookup", "arguments": {"id": "A-12"}, "id": "abcdefghi"}]</s>',
    "two": '[TOOL_CALLS][{"name": "lookup", "arguments": {"id": "A-12"}}, '
    '{"name": "press", "arguments": {"color": "red"}}]</s>',
    "text": "The order is shipped.</s>",
    "bad": '[TOOL_CALLS][{"name": "lookup", "arguments": {"id": ]</s>',
}


@pytest.mark.parametrize(
    ("family", "replies"), [(CHATML, HERMES), (LLAMA3, LLAMA), (MISTRAL, MISTRAL_REPLIES)]
)
def test_parse_reply_known_good(family: str, replies: dict[str, str]) -> None:
    fmt = ChatFormat(tiny_family_policy(family).tokenizer)

    def calls(reply: Reply) -> list[tuple[str, dict]]:
        return [(c.name, c.arguments) for c in reply.tool_calls]

    one = fmt.parse_reply(replies["one"])
    assert calls(one) == [(CALL.name, CALL.arguments)] and one.content is None
    assert calls(fmt.parse_reply(replies["two"])) == [
        (CALL.name, CALL.arguments),
        (CALL2.name, CALL2.arguments),
    ]
    text = fmt.parse_reply(replies["text"])
    assert text == Reply("The order is shipped.", [])
    bad = fmt.parse_reply(replies["bad"])
    assert bad.tool_calls == [] and bad.content  # malformed JSON stays content
    assert parse_any(replies["one"].split("<|")[0].removesuffix("</s>")).tool_calls


def test_mistral_call_id_survives_parsing() -> None:
    fmt = ChatFormat(tiny_family_policy(MISTRAL).tokenizer)
    reply = fmt.parse_reply(MISTRAL_REPLIES["one"])
    assert reply.tool_calls[0].id == "abcdefghi"
    message = reply.to_openai()
    assert message["tool_calls"][0]["function"]["name"] == "lookup"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"id": "A-12"}


@pytest.mark.parametrize(
    "text", ["", "   ", "<tool_call>", "[TOOL_CALLS]", "{", '{"name": 3}', "\x00"]
)
def test_parse_reply_never_raises(text: str) -> None:
    for family in FAMILIES:
        reply = ChatFormat(tiny_family_policy(family).tokenizer).parse_reply(text)
        assert reply.tool_calls == []


# The template check before weights load --------------------------------------------------------
def test_require_tool_template_checks_before_weights(tmp_path) -> None:
    from tracegym.generation.model import ModelError, require_tool_template, save_policy, tiny_model

    plain = tmp_path / "plain"
    policy = tiny_model(0)
    policy.tokenizer.chat_template = PLAIN_CHATML  # a ChatML template with no tools
    save_policy(policy, plain)
    (plain / "tracegym_model.json").unlink()  # a user's folder, not one tracegym made
    for weights in plain.glob("*.safetensors"):
        weights.write_bytes(b"not weights")  # never read: the error must be the template one
    with pytest.raises(ModelError, match="cannot express tools") as caught:
        require_tool_template(plain)
    assert "\n" not in str(caught.value)
    good = tmp_path / "chatml_tools.jinja"
    good.write_text(template_text(CHATML))
    fmt = require_tool_template(plain, chat_template=good)
    assert fmt.family == CHATML and "lookup" in fmt.render(CONVERSATION[:2], tools=TOOLS)
    bad = tmp_path / "plain.jinja"
    bad.write_text(PLAIN_CHATML)
    with pytest.raises(ModelError, match="cannot express tools"):
        require_tool_template(plain, chat_template=bad)
    with pytest.raises(ModelError, match="cannot read chat template"):
        require_tool_template(plain, chat_template=tmp_path / "missing.jinja")
    with pytest.raises(ModelError, match=r"no config\.json"):
        require_tool_template(tmp_path / "nowhere")


def test_require_tool_template_accepts_family_folders(tmp_path) -> None:
    from tracegym.generation.model import require_tool_template

    for family in FAMILIES:
        folder = tiny_family_model(family, 0, target=tmp_path / family)
        assert require_tool_template(folder).family == family


def test_tokenizer_response_template_is_preferred() -> None:
    """A tokenizer that carries its own response template is parsed by transformers with it."""
    tokenizer = tiny_family_policy(MISTRAL).tokenizer
    tokenizer.response_template = {
        "version": 1,
        "start_anchor": "[/INST]",
        "fields": {
            "content": {"close": "</s>", "content": "text"},
            "tool_calls": {
                "open": "<call>",
                "close": "</call>",
                "content": "json",
                "repeats": True,
            },
        },
    }
    fmt = ChatFormat(tokenizer)
    reply = fmt.parse_reply('ok <call>{"name": "lookup", "arguments": {"id": "A-12"}}</call></s>')
    assert reply == Reply("ok", [ToolCall("lookup", {"id": "A-12"})])


def test_hermes_schema_and_fallback_agree() -> None:
    from tracegym.generation.chat_format import parse_hermes

    fmt = ChatFormat(tiny_family_policy(CHATML).tokenizer)
    for text in [*HERMES.values(), '<tool_call>{"foo": 1}</tool_call>', "a <tool_call>"]:
        assert fmt.parse_reply(text) == parse_hermes(text.removesuffix("<|im_end|>"))


def test_a_call_whose_closing_tag_the_token_limit_cut_is_still_a_call() -> None:
    """`max_tokens` stopped the reply inside `</tool_call>`: the call before it is whole."""
    fmt = ChatFormat(tiny_family_policy(CHATML).tokenizer)
    arguments = '{"appointment_id": "A9", "slot_id": "S6"}'
    call = f'<tool_call>\n{{"name": "reschedule", "arguments": {arguments}}}\n'
    for cut in ("</tool_call", "</tool_", "</", ""):
        reply = fmt.parse_reply(call + cut)
        assert reply.tool_calls == [
            ToolCall("reschedule", {"appointment_id": "A9", "slot_id": "S6"})
        ]
        assert reply.content is None
    # a call cut inside its JSON stays text: nothing is guessed
    assert fmt.parse_reply(call[:-12]).tool_calls == []
