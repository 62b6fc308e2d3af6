"""Token ids of a conversation in the model's own chat template, built one turn at a time.

    from tracegym.generation.chat_tokens import ChatTokens, Conversation
    chat = ChatTokens(ChatFormat(tokenizer), tools)
    ids = chat.prompt(messages)                       # what a server renders for this request
    ...generate until chat.stop_id...
    ids += chat.after_reply(history, [tool_message])  # the tool result and the next turn's header
    ids, mask = chat.encode(conversation.messages)    # training: 1 on the assistant's tokens

Rollouts keep a KV cache across an episode, so a turn may only add tokens: the model's sampled
reply stays as sampled, and what follows it is the template's own text for the new messages (the
difference between rendering the conversation with and without them). Training examples are
built the same way from demonstrations, with each assistant turn in the template's canonical
form, so what an adapter learns is what `tracegym serve` and vLLM render for the same messages.
A template that rewrites earlier turns when a new one is added (some drop old reasoning) cannot
be extended like this: `ChatTemplateError` says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.generation.chat_format import (
    END_MARKERS,
    ChatFormat,
    Reply,
    normalise_tools,
)


class ChatTemplateError(ValueError):
    """A chat template that cannot be used turn by turn (the message says why)."""


@dataclass
class Conversation:
    """OpenAI-shaped messages and the tool schemas sent with them: what a template renders."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def of(
        cls,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        system_prompt: str = "",
    ) -> Conversation:
        """`messages` with `system_prompt` as their system message when they have none."""
        out = [dict(m) for m in messages]
        if system_prompt and not any(m.get("role") == "system" for m in out):
            out.insert(0, {"role": "system", "content": system_prompt})
        return cls(out, normalise_tools(tools))

    def to_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "tools": self.tools}

    @classmethod
    def from_dict(cls, data: Any) -> Conversation:
        """A conversation from its dict, or from a bare list of messages (no tools)."""
        if isinstance(data, list):
            return cls([dict(m) for m in data])
        if not isinstance(data, Mapping) or not isinstance(data.get("messages"), list):
            raise ValueError("a conversation is a list of messages or {'messages': [...]}")
        return cls([dict(m) for m in data["messages"]], normalise_tools(data.get("tools")))


def stop_token(fmt: ChatFormat) -> tuple[str, int]:
    """The token that ends an assistant turn in `fmt`'s family (its eos for an unknown one)."""
    tokenizer = fmt.tokenizer
    candidates = [*END_MARKERS.get(fmt.family, ()), tokenizer.eos_token]
    for marker in candidates:
        if not marker:
            continue
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if token_id is not None and token_id != tokenizer.unk_token_id:
            return marker, int(token_id)
    raise ChatTemplateError("the tokenizer has no token that ends an assistant turn")


class ChatTokens:
    """One conversation's token ids in `fmt`'s template, with `tools` (see the module doc)."""

    def __init__(self, fmt: ChatFormat, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.fmt = fmt
        self.tools = normalise_tools(tools)
        self.stop_text, self.stop_id = stop_token(fmt)
        self._cache: dict[str, list[int]] = {}

    # text <-> ids --------------------------------------------------------------------------------
    def ids(self, text: str) -> list[int]:
        """`text` as ids; the template wrote the special tokens, so none are added."""
        cached = self._cache.get(text)
        if cached is None:
            cached = list(self.fmt.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(text) < 4096:
                self._cache[text] = cached
        return list(cached)

    def reply_text(self, new_ids: Sequence[int]) -> str:
        """The text of a sampled reply, without its stop token (special tokens kept)."""
        body = [t for t in new_ids if t != self.stop_id]
        return self.fmt.tokenizer.decode(body, skip_special_tokens=False)

    def parse(self, new_ids: Sequence[int]) -> Reply:
        return self.fmt.parse_reply(self.reply_text(new_ids))

    def render(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        return self.fmt.render(messages, self.tools, add_generation_prompt=generation_prompt)

    # turn by turn --------------------------------------------------------------------------------
    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The whole conversation rendered, ending with the assistant's generation prompt."""
        return self.ids(self.render(messages, True))

    def after_reply(
        self,
        history: Sequence[Mapping[str, Any]],
        new: Sequence[Mapping[str, Any]],
        *,
        ended: bool = True,
    ) -> list[int]:
        """What follows a reply in the template: `history` ends with the reply (as a message),
        `new` are the messages after it (tool results, the next user turn). `ended`: whether the
        sampled reply ended with the stop token (else it is added here)."""
        before = self.render(history, False)
        after = self.render([*history, *new], True)
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template changes earlier turns when one is added, so a conversation "
                "cannot be extended token by token"
            )
        cut = before.rfind(self.stop_text)
        tail = before[cut + len(self.stop_text) :] if cut >= 0 else ""
        return ([] if ended else [self.stop_id]) + self.ids(tail + after[len(before) :])

    def encode(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
        """(ids, mask) of a whole conversation for training: mask is 1 on each assistant
        turn's tokens and its stop token, rendered by the template as it renders them for a
        request, and joined as `prompt`/`after_reply` join a rollout's turns."""
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not turns:
            ids = self.ids(self.render(messages, False))
            return ids, [0] * len(ids)
        ids = self.prompt(messages[: turns[0]])
        mask = [0] * len(ids)
        for n, index in enumerate(turns):
            head = self.render(messages[:index], True)
            whole = self.render(messages[: index + 1], False)
            if not whole.startswith(head):
                raise ChatTemplateError(
                    "the chat template renders an assistant turn differently from its "
                    "generation prompt, so its reply cannot be told apart for training"
                )
            body = whole[len(head) :]
            cut = body.rfind(self.stop_text)
            body = body[:cut] if cut >= 0 else body
            reply = [*self.ids(body), self.stop_id]
            ids += reply
            mask += [1] * len(reply)
            following = turns[n + 1] if n + 1 < len(turns) else len(messages)
            if following > index + 1:
                more = self.after_reply(messages[: index + 1], messages[index + 1 : following])
                ids += more
                mask += [0] * len(more)
        return ids, mask


__all__ = ["ChatTemplateError", "ChatTokens", "Conversation", "stop_token"]
