"""Rehearsal keeps the agent's passing conversations, less those that call the action the
environment teaches (`sft.rehearsal_for`)."""

from __future__ import annotations

from types import SimpleNamespace

from tracegym.generation.chat_tokens import Conversation
from tracegym.training.sft import calls_tool, rehearsal_for


def _chat(*calls: str) -> Conversation:
    out = [{"role": "system", "content": "rules"}, {"role": "user", "content": "please"}]
    for i, name in enumerate(calls):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": "{}"}}  # fmt: skip
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "{}"})
    out.append({"role": "assistant", "content": "Done."})
    return Conversation(out)


def test_conversations_that_call_the_action_are_left_out():
    env = SimpleNamespace(spec=SimpleNamespace(roles={"action": "update_address"}))
    status = _chat("find_user", "get_order")
    detour = _chat("find_user", "get_order", "update_address")
    # a conversation recorded before replies were OpenAI-shaped: Hermes calls as text
    hermes = '<tool_call>{"name": "update_address", "arguments": {}}</tool_call>'
    text = [{"role": "assistant", "content": hermes}]
    assert calls_tool(detour, "update_address") and calls_tool(text, "update_address")
    assert not calls_tool(status, "update_address")
    assert rehearsal_for(env, [status, detour, text]) == [status]


def test_an_environment_without_an_action_keeps_them_all():
    chats = [_chat("find_user"), _chat("find_user", "cancel_order")]
    assert rehearsal_for(SimpleNamespace(spec=None), chats) == chats
    assert rehearsal_for(SimpleNamespace(spec=SimpleNamespace(roles={})), chats) == chats
