"""A sound lower bound on how many tokens a text becomes, from its length alone.

Tokenizing megabytes takes seconds; measuring their length takes next to nothing. For a BPE
tokenizer whose pipeline never drops or shrinks its input, every token covers at most ``L``
units of the text, ``L`` being the longest token of the vocabulary, so ``n`` units become at
least ``ceil(n / L)`` tokens. Units are UTF-8 bytes behind byte-level pre-tokenization (each
token is a byte string) and characters otherwise. The gateway refuses a prompt that this bound
already puts over its limit before tokenizing it. A character count against "about four bytes
per token" would be unsound both ways; this bound only ever errs low. Where no such bound holds
(a normalizer that may shrink text, a pre-tokenizer that drops it, a model that fuses unknown
spans into one token) it is 0, and the exact count, taken off the event loop, decides.
"""

from __future__ import annotations

import json
from typing import Any

#: Pre-tokenizers that split the text without dropping any of it (``Split`` and
#: ``Punctuation`` unless their behavior is ``Removed``).
_KEEPS_INPUT = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}


class TokenBound:
    """``at_least(text)``: a number of tokens ``text`` cannot be encoded in fewer of."""

    def __init__(self, tokenizer: Any) -> None:
        self.unit_limit, self.in_bytes = _longest_token(tokenizer)

    def at_least(self, text: str) -> int:
        if self.unit_limit is None:
            return 0
        units = len(text.encode("utf-8")) if self.in_bytes else len(text)
        return -(-units // self.unit_limit)


def _longest_token(tokenizer: Any) -> tuple[int | None, bool]:
    """The longest token in units, and whether units are bytes; (None, False) when unsound."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # only fast tokenizers say
    if backend is None:
        return None, False
    spec = json.loads(backend.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer")
    fuses_unknowns = model.get("unk_token") is not None and model.get("fuse_unk")
    steps = _pre_tokenizer_steps(pre)
    if spec.get("normalizer") is not None or model.get("type") != "BPE" or fuses_unknowns:
        return None, False
    if steps is None:
        return None, False
    in_bytes = "ByteLevel" in steps
    added = tokenizer.added_tokens_decoder
    longest = 1
    for token_id, token in enumerate(tokenizer.convert_ids_to_tokens(range(len(tokenizer)))):
        if token_id in added:  # matched on the raw text, so measured as written
            length = len(token.encode("utf-8")) if in_bytes else len(token)
        else:  # a byte-level vocabulary spells each byte as one character
            length = len(token)
        longest = max(longest, length)
    return longest, in_bytes


def _pre_tokenizer_steps(pre: dict[str, Any] | None) -> list[str] | None:
    """The pre-tokenizer's step types, or None if one of them may drop input."""
    if pre is None:
        return []
    if pre["type"] == "Sequence":
        steps: list[str] = []
        for inner in pre["pretokenizers"]:
            found = _pre_tokenizer_steps(inner)
            if found is None:
                return None
            steps += found
        return steps
    if pre["type"] not in _KEEPS_INPUT or pre.get("behavior") == "Removed":
        return None
    return [pre["type"]]
