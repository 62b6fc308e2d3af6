"""Conversations as token ids in each family's own template, turn by turn and for training."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tracegym.generation.chat_format import FAMILIES, ChatFormat
from tracegym.generation.chat_tokens import ChatTemplateError, ChatTokens, Conversation
from tracegym.generation.tiny_families import tiny_family_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "an order's status",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_order",
        "arguments": '{"order_id": "O1234"}'}}  # fmt: skip
EPISODE = [
    {"role": "system", "content": "You are a shop's support agent."},
    {"role": "user", "content": "Where is my order O1234?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "Your order O1234 is shipped."},
]


@pytest.fixture(scope="module", params=FAMILIES)
def chat(request) -> ChatTokens:
    return ChatTokens(ChatFormat(tiny_family_tokenizer(request.param)), TOOLS)


def test_turn_by_turn_ids_are_the_template_rendering(chat: ChatTokens) -> None:
    """A rollout's ids (prompt, canonical reply, what follows it) decode to exactly what the
    template renders for the whole conversation: what a server sends for the next request."""
    decode = chat.fmt.tokenizer.decode
    ids = chat.prompt(EPISODE[:2])
    head = chat.render(EPISODE[:2], True)
    whole = chat.render(EPISODE[:3], False)
    reply = whole[len(head) : whole.rfind(chat.stop_text)]
    ids += [*chat.ids(reply), chat.stop_id]
    ids += chat.after_reply(EPISODE[:3], EPISODE[3:4])
    assert decode(ids, skip_special_tokens=False) == chat.render(EPISODE[:4], True)


def test_a_reply_cut_short_gets_its_stop_token(chat: ChatTokens) -> None:
    assert chat.after_reply(EPISODE[:3], EPISODE[3:4], ended=False)[0] == chat.stop_id
    assert chat.after_reply(EPISODE[:3], EPISODE[3:4], ended=True)[0] != chat.stop_id


def test_training_mask_covers_the_assistant_turns_only(chat: ChatTokens) -> None:
    ids, mask = chat.encode(EPISODE)
    assert len(ids) == len(mask)
    decode = chat.fmt.tokenizer.decode
    trained = decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    assert "get_order" in trained and "O1234" in trained and "is shipped." in trained
    assert "support agent" not in trained and "Where is" not in trained
    assert '"status": "shipped"' not in trained  # the tool's result is context, not a target
    assert [t for t, m in zip(ids, mask, strict=True) if m].count(chat.stop_id) == 2
    # the trained reply is what the parser reads back as the call
    first = ids.index(chat.stop_id, len(chat.prompt(EPISODE[:2])))
    reply = chat.fmt.parse_reply(chat.reply_text(ids[len(chat.prompt(EPISODE[:2])) : first + 1]))
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("get_order", {"order_id": "O1234"})
    ]


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    tokenizer = tiny_family_tokenizer("chatml")
    counting = (
        "{{ '<|im_start|>system\n' + (messages | length | string) + ' messages<|im_end|>\n' }}"
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + (m.content or '') "
        "+ '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    chat = ChatTokens(ChatFormat(tokenizer, counting))
    with pytest.raises(ChatTemplateError, match="changes earlier turns"):
        chat.after_reply(EPISODE[:3], EPISODE[3:4])


def test_conversation_round_trips_and_takes_bare_message_lists() -> None:
    conversation = Conversation.of(EPISODE[1:], TOOLS, system_prompt="Be brief.")
    assert conversation.messages[0] == {"role": "system", "content": "Be brief."}
    assert Conversation.from_dict(conversation.to_dict()) == conversation
    assert Conversation.from_dict(EPISODE).tools is None
    with pytest.raises(ValueError, match="list of messages"):
        Conversation.from_dict({"messages": "nope"})
