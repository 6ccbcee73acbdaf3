"""The embedded engine's prefix cache: the KV of finished sequences, reused by token prefix.

A rollout's turn k+1 prompt starts with turn k's prompt and completion, so the KV that turn k
left behind serves every token of that prefix. Entries are keyed by token ids, not by request
or rollout ids: a lookup returns the entry sharing the longest prefix with the new prompt,
whoever computed it. The cache holds at most ``max_tokens`` tokens of KV and evicts the least
recently used entries first; an entry that is a prefix of a newer one is dropped (the newer
one serves every lookup it would). Entries hold KV of the weights they were computed with:
the engine clears the cache whenever its weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True, eq=False)
class CachedPrefix:
    """A token sequence and its KV (batch of one, one column per token)."""

    token_ids: torch.Tensor
    kv: DynamicCache

    def __len__(self) -> int:
        return len(self.token_ids)

    def kv_head(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values of the first ``length`` tokens (views, not copies)."""
        return [(keys[..., :length, :], values[..., :length, :]) for keys, values, _ in self.kv]


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading token ids the 1-D tensors ``a`` and ``b`` share."""
    length = min(len(a), len(b))
    differ = (a[:length] != b[:length]).nonzero()
    return int(differ[0]) if len(differ) else length


class PrefixCache:
    """LRU entries of KV keyed by token ids, at most ``max_tokens`` tokens in all (0: off)."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens {max_tokens} is negative")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self.tokens = 0
        #: Lookups so far, and those that found at least one reusable token.
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def accepts(self, length: int) -> bool:
        """Whether an entry of ``length`` tokens fits at all (worth copying out of a batch)."""
        return 0 < length <= self.max_tokens

    def match(self, token_ids: torch.Tensor) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with ``token_ids``, and that prefix's length."""
        self.lookups += 1
        best, length = self._longest(token_ids)
        if best is not None:
            self.hits += 1
            self._entries.move_to_end(id(best))
        return best, length

    def covers(self, token_ids: torch.Tensor) -> bool:
        """Whether an entry holds all of ``token_ids`` already (not counted as a lookup)."""
        return self._longest(token_ids)[1] == len(token_ids)

    def _longest(self, token_ids: torch.Tensor) -> tuple[CachedPrefix | None, int]:
        best, best_length = None, 0
        for entry in self._entries.values():
            length = common_prefix_length(token_ids, entry.token_ids)
            if length > best_length:
                best, best_length = entry, length
        return best, best_length

    def insert(self, entry: CachedPrefix) -> None:
        """Keep ``entry``, unless it is too large or an entry already covers its tokens."""
        if not self.accepts(len(entry)):
            return
        for key, held in list(self._entries.items()):
            shared = common_prefix_length(entry.token_ids, held.token_ids)
            if shared == len(entry):  # ``held`` serves every lookup ``entry`` would
                self._entries.move_to_end(key)
                return
            if shared == len(held):
                self._remove(key)
        self._entries[id(entry)] = entry
        self.tokens += len(entry)
        while self.tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def _remove(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key))
