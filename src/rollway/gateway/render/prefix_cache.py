"""A rendered prompt's ids by pieces, each piece tokenized once: shared prefixes cost nothing.

In agentic RL thousands of rollouts share a system prompt and tool definitions (1-5k tokens)
and differ in a question. A fast tokenizer cuts the text at its added tokens before it runs
the BPE, so the text between two of them is encoded on its own: a message that the template
opens with a special token (``<|im_start|>``) has the same ids whatever its neighbours. The
render is cut where an added token begins, and each piece's ids are kept by its text (a
bounded LRU): a new task's prompt tokenizes only its pieces not seen before.

Only tokens the tokenizer matches in the raw text, whatever surrounds them, cut: neither
taking the whitespace before them (``lstrip``), nor matched as a word only (``single_word``),
nor matched in the normalized text where the normalizer may change it (``normalized``). A
tokenizer whose pieces do not give the whole text's ids on a probe gets no cache
(``PieceIds.for_tokenizer``), and the renderer audits real prompts now and then against
encoding the whole text (``ChatRenderer.prompt_ids``).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tokenizers import normalizers

#: ``encode_many(texts)``: each text's ids, without special tokens added.
EncodeMany = Callable[[list[str]], list[list[int]]]
#: Characters of piece text kept (about 4 per token; ids take ~36 bytes a token).
MAX_CHARS = 2_000_000
#: Pieces longer than this are encoded and not kept: one would push out many shared ones.
MAX_PIECE_CHARS = MAX_CHARS // 8


class PieceIds:
    """Ids of texts by their pieces, each piece's ids kept by its text (thread-safe: prompts
    are tokenized in worker threads too)."""

    def __init__(self, tokens: re.Pattern[str], cut: frozenset[str], encode_many: EncodeMany):
        self._tokens = tokens
        self._cut = cut
        self._encode_many = encode_many
        self._kept: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        #: Characters encoded, and pieces found kept: what a benchmark or a test reads.
        self.encoded_chars = 0
        self.hits = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, encode_many: EncodeMany) -> PieceIds | None:
        """The cache for ``tokenizer``, or None where it has no token to cut at or its
        pieces do not encode as the whole does (checked on a probe)."""
        found = added_tokens(tokenizer)
        if found is None:
            return None
        pieces = cls(*found, encode_many)
        probe = _probe(found[1])
        whole = encode_many([probe])[0]
        # Twice: the pieces encoded, then kept.
        if not pieces.ids(probe) == whole == pieces.ids(probe):
            return None
        pieces.encoded_chars = pieces.hits = 0
        return pieces

    def split(self, text: str) -> list[str]:
        """``text`` cut before each token that cuts (its pieces join to it)."""
        starts = [m.start() for m in self._tokens.finditer(text) if m.group() in self._cut]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]

    def ids(self, text: str) -> list[int]:
        """``text``'s ids: its kept pieces' and the others' encoded in one call."""
        pieces = self.split(text)
        found: list[list[int] | None] = []
        with self._lock:
            for piece in pieces:
                ids = self._kept.get(piece)
                if ids is not None:
                    self._kept.move_to_end(piece)
                found.append(ids)
        missing = [piece for piece, ids in zip(pieces, found, strict=True) if ids is None]
        self.hits += len(pieces) - len(missing)
        if missing:
            self.encoded_chars += sum(map(len, missing))
            encoded = iter(self._encode_many(missing))
            for at, piece in enumerate(pieces):
                if found[at] is None:
                    found[at] = ids = next(encoded)
                    self._keep(piece, ids)
        out: list[int] = []
        for ids in found:
            out += ids  # type: ignore[arg-type]  # every None was filled above
        return out

    def _keep(self, piece: str, ids: list[int]) -> None:
        if len(piece) > MAX_PIECE_CHARS:
            return
        with self._lock:
            if piece in self._kept:
                return
            self._kept[piece] = ids
            self._chars += len(piece)
            while self._chars > MAX_CHARS:
                dropped, _ = self._kept.popitem(last=False)
                self._chars -= len(dropped)


def added_tokens(tokenizer: Any) -> tuple[re.Pattern[str], frozenset[str]] | None:
    """A pattern matching the tokenizer's added tokens (special or not: it cuts at all of
    them), longest first as the tokenizer matches them, and those to cut before. None where
    there is none to cut before, or no fast tokenizer to ask."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    added = list(backend.get_added_tokens_decoder().values())
    # A token matched in the normalized text is matched as in the raw one where the
    # normalizer changes nothing (none, or an empty sequence: DeepSeek V3's).
    normalizer = backend.normalizer
    raw = normalizer is None or (
        isinstance(normalizer, normalizers.Sequence) and not len(normalizer)
    )
    cut = frozenset(
        token.content
        for token in added
        if token.content
        and not (token.lstrip or token.single_word)
        and (raw or not token.normalized)
    )
    if not cut:
        return None
    contents = sorted({token.content for token in added if token.content}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, contents))), cut


def _probe(cut: frozenset[str]) -> str:
    """Text around each cut token that a tokenizer merging across it would encode otherwise:
    spaces, newlines and letters on both sides."""
    parts = ["a ", " \n", "x", "\n\n", " ", "ab"]
    return "".join(
        f"{parts[at % 6]}{token}{parts[(at + 1) % 6]}" for at, token in enumerate(sorted(cut))
    )
