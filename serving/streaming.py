"""Streaming a reply's content while it is generated, without streaming a tool call as text.

A reply is plain content or a tool call (or content then a call), and which one is known for
sure only once it is whole and parsed. `ContentStream` lets the text out as it grows, holding
back whatever might still turn out to be part of a call (from the family's call opener, or a
partial one at the end) and trailing whitespace (the parsed content is stripped); at the end,
`finish` gives the rest of the parsed content. What was sent is always a prefix of the parsed
content, so the deltas add up to the non-streaming reply's content.
"""

from __future__ import annotations

from tracegym.generation.chat_format import CHATML, LLAMA3, MISTRAL

OPENERS: dict[str, tuple[str, ...]] = {
    CHATML: ("<tool_call>",),
    MISTRAL: ("[TOOL_CALLS]",),
    LLAMA3: ("<|python_tag|>",),
}
GENERIC_OPENERS = ("<tool_call>", "[TOOL_CALLS]")


class ContentStream:
    """The content deltas of one reply whose text grows (`update`), then the rest (`finish`)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.openers = OPENERS.get(family, GENERIC_OPENERS)
        self.sent = ""
        self.stopped = False  # a call opener was seen: nothing more until the end

    def _safe(self, text: str) -> str:
        """The part of `text` that is content whatever follows."""
        text = text.lstrip()
        if self.family == LLAMA3 and text[:1] in ("", "{"):  # Llama 3 calls are bare JSON
            self.stopped = bool(text)
            return ""
        cut = len(text)
        for opener in self.openers:
            found = text.find(opener)
            if found >= 0:
                cut, self.stopped = min(cut, found), True
                continue
            for k in range(min(len(opener) - 1, len(text)), 0, -1):
                if text.endswith(opener[:k]):
                    cut = min(cut, len(text) - k)
                    break
        safe = text[:cut].rstrip()
        while safe.endswith("\ufffd"):  # a character split across tokens
            safe = safe[:-1]
        return safe

    def update(self, text: str) -> str:
        """The new content to send now that the reply's text so far is `text` ("" for none)."""
        if self.stopped:
            return ""
        safe = self._safe(text)
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent) :], safe
        return delta

    def finish(self, content: str | None) -> str | None:
        """The rest of the parsed reply's `content`; None when what was sent is not its start
        (cannot happen with the parsers in `chat_format`, but is not assumed)."""
        content = content or ""
        if not content.startswith(self.sent):
            return None
        return content[len(self.sent) :]


__all__ = ["ContentStream"]
