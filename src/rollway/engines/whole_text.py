"""Text decoded token by token in whole characters, and stop strings matched on it.

A byte-level tokenizer may spread one character over several tokens (an emoji over three);
each of its first tokens decodes to U+FFFD, the replacement character, which the output does
not contain. ``WholeText`` holds such a piece back until the tokens that complete it come, as
vLLM's detokenizer and tokenizers' ``DecodeStream`` do, so a stop string (``"\\ufffd"``
included) matches only characters the answer really has. A U+FFFD the model did sample is
matched once a later token shows it is whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]

REPLACEMENT = "\ufffd"


class WholeText:
    """The text of the tokens pushed so far, whole characters only (``text``)."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        # The text of the ids from ``_prefix`` on, less that of those before ``_read``, is
        # what the newest tokens add: decoding a few ids of context keeps a tokenizer's
        # leading-space rules right without decoding the whole answer every time.
        self._prefix = 0
        self._read = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        """Take the next token; return the text it completed ("" while a character is open)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        added = after[len(before) :]
        self.text += added
        self._prefix, self._read = self._read, len(self._ids)
        return added


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the first stop string in ``text`` begins, and which it is. A run of U+FFFD that
    ends the text may be a character cut short (the answer ended inside it) and is left out."""
    whole = text.rstrip(REPLACEMENT)
    found = [(at, stop) for stop in stops if (at := whole.find(stop)) >= 0]
    return min(found, key=lambda cut: cut[0]) if found else None
