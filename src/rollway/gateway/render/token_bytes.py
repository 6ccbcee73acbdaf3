"""A token's own bytes, for OpenAI's ``logprobs.content[].bytes`` ("useful where characters
are represented by multiple tokens and their byte representations must be combined").

A character split across tokens decodes, a token alone, to U+FFFD; its UTF-8 bytes would not
join with the next token's into the character. The token's bytes come from its vocabulary
string instead: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) writes each byte as one
printable character of GPT-2's table; SentencePiece's byte fallback writes ``<0xE6>``.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

_REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` (transformers') reversed: each byte's printable stand-in
    -> the byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer: Any, token_id: int, text: str) -> bytes:
    """The bytes of token ``token_id``, whose text alone is ``text``: ``text``'s UTF-8 unless
    it holds U+FFFD (part of a character), then the vocabulary entry's bytes where its form is
    known (byte-level, byte fallback), else ``text``'s."""
    if _REPLACEMENT not in text:
        return text.encode()
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str):
        return text.encode()
    fallback = _BYTE_FALLBACK.fullmatch(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    alphabet = byte_level_alphabet()
    if all(char in alphabet for char in piece):
        return bytes(alphabet[char] for char in piece)
    return text.encode()
