"""Rehearsal keeps the agent's passing conversations, less those that call the action the
environment teaches (`sft.rehearsal_for`)."""

from __future__ import annotations

from types import SimpleNamespace

from tracegym.training.sft import calls_tool, rehearsal_for


def _chat(*calls: str) -> list[dict[str, str]]:
    out = [{"role": "system", "content": "rules"}, {"role": "user", "content": "please"}]
    for name in calls:
        out.append(
            {
                "role": "assistant",
                "content": f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>',
            }
        )
        out.append({"role": "tool", "content": "{}"})
    out.append({"role": "assistant", "content": "Done."})
    return out  # fmt: skip


def test_conversations_that_call_the_action_are_left_out():
    env = SimpleNamespace(spec=SimpleNamespace(roles={"action": "update_address"}))
    status = _chat("find_user", "get_order")
    detour = _chat("find_user", "get_order", "update_address")
    openai = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "update_address", "arguments": "{}"}}],
        }
    ]
    assert calls_tool(detour, "update_address") and calls_tool(openai, "update_address")
    assert not calls_tool(status, "update_address")
    assert rehearsal_for(env, [status, detour, openai]) == [status]  # fmt: skip


def test_an_environment_without_an_action_keeps_them_all():
    chats = [_chat("find_user"), _chat("find_user", "cancel_order")]
    assert rehearsal_for(SimpleNamespace(spec=None), chats) == chats
    assert rehearsal_for(SimpleNamespace(spec=SimpleNamespace(roles={})), chats) == chats
