"""OpenAI's ``logprobs.content[].bytes`` are each token's own bytes: where a character is split
across tokens, the pieces' bytes join into it (a token alone decodes to U+FFFD)."""

from __future__ import annotations

import openai
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.token_bytes import byte_level_alphabet, token_bytes
from tests.conftest import Closing
from tests.gateway.test_http_openai_sdk import register
from tests.gateway.test_streaming import ScriptedEngine, serve

#: Characters of 2, 3 and 4 bytes, some split across tokens by SmolLM2's byte-level BPE.
TEXT = "héllo → 日本語 🙂 Ωμέγα"


def test_the_alphabet_is_gpt2s_table_reversed() -> None:
    assert byte_level_alphabet() == {char: byte for byte, char in bytes_to_unicode().items()}


def test_split_characters_join_from_their_tokens_bytes(
    renderer: ChatRenderer, closing: Closing
) -> None:
    engine = ScriptedEngine(renderer, TEXT + "<|im_end|>")
    split = [i for i in engine.ids if "\ufffd" in renderer.decode_one(i)]
    assert len(split) >= 4  # the test needs tokens that are parts of characters
    for served in serve(engine, renderer):
        reg = register(served, max_tokens=64)
        client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Say it."}], logprobs=True
        )
    tokens = reply.choices[0].logprobs.content
    assert reply.choices[0].message.content == TEXT
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == TEXT + "<|im_end|>"


class ByteFallbackTokenizer:
    """SentencePiece's byte fallback (Llama 2, Mistral): a byte with no piece is ``<0xE6>``."""

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return {1: "<0xE6>", 2: "▁hello"}[token_id]


def test_byte_fallback_pieces_are_their_byte() -> None:
    tokenizer = ByteFallbackTokenizer()
    assert token_bytes(tokenizer, 1, "\ufffd") == b"\xe6"
    assert token_bytes(tokenizer, 2, " hello") == b" hello"  # whole characters: the text's
