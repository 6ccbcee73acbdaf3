"""The embedded engine's running batch: rows that decode together over one KV cache.

Rows are right-aligned: each row's newest token sits in the last column. A column a row does
not use holds zeros and is masked out: left padding, and the gap between a short reused
prefix and its suffix when rows of different prefix lengths are prefilled together. Position
ids are explicit (a row's next position is the number of its unmasked columns), so each row
computes exactly what it would alone. Rows join (``prefill``, then ``merge``) and leave
(``select``) between two decode steps; leaving drops the columns no remaining row uses.

Only full-attention models fit this layout (a sliding window would count masked columns).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from rollway.engines.embedded.kv_cache import CachedPrefix

Row = TypeVar("Row")
#: Keys and values, ``[rows, kv_heads, columns, head_dim]`` each.
KV = tuple[torch.Tensor, torch.Tensor]
#: A prompt's reusable head: the entry holding its KV (None: nothing reused) and its length.
Reuse = tuple[CachedPrefix | None, int]
#: Spare columns allocated ahead, so that decode steps write in place.
_ROOM = 32


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into spare columns (growing by half when full) where
    HF's copies the whole layer to append each one; ``keys`` and ``values`` are views of the
    columns in use. Built from ``parts`` stacked by rows, each right-aligned on ``width``
    columns (zeros where a part is narrower), or empty (its first ``update`` allocates)."""

    def __init__(self, parts: Sequence[KV] = (), width: int = 0, room: int = _ROOM) -> None:
        # untyped_calls_exclude (pyproject.toml) does not reach calls through super().
        super().__init__()  # type: ignore[no-untyped-call]
        self.room = room
        self._columns = 0  # in use, of the buffers'
        if not parts:
            return
        keys = parts[0][0]
        rows = sum(k.shape[0] for k, _ in parts)
        self._allocate(keys, (rows, keys.shape[1], width + room, keys.shape[3]))
        row = 0
        for part_keys, part_values in parts:
            rows_here, start = part_keys.shape[0], width - part_keys.shape[2]
            self._key_buffer[row : row + rows_here, :, start:width] = part_keys
            self._value_buffer[row : row + rows_here, :, start:width] = part_values
            row += rows_here
        self._use(width)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> KV:
        if not self.is_initialized:
            batch, heads, length, dim = key_states.shape
            self._allocate(key_states, (batch, heads, length + self.room, dim))
            self._use(0)
        start = self._columns
        end = start + key_states.shape[2]
        if end > self._key_buffer.shape[2]:
            self._grow(end + max(self.room, end // 2))
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        return self._use(end)

    def kv(self) -> KV:
        """``keys`` and ``values``, typed as set: HF types them optional (None until the
        first ``update``; a batch's layers have all had theirs)."""
        return self._key_buffer[:, :, : self._columns], self._value_buffer[:, :, : self._columns]

    def _allocate(self, like: torch.Tensor, shape: tuple[int, ...]) -> None:
        self.lazy_initialization(like, like)
        # Zeros, not garbage: a masked column weighs 0, and 0 * NaN would still be NaN.
        self._key_buffer = like.new_zeros(shape)
        self._value_buffer = like.new_zeros(shape)

    def _grow(self, columns: int) -> None:
        keys, values = self.kv()
        self._allocate(keys, (*keys.shape[:2], columns, keys.shape[3]))
        self._key_buffer[:, :, : self._columns] = keys
        self._value_buffer[:, :, : self._columns] = values
        self._use(self._columns)

    def _use(self, columns: int) -> KV:
        self._columns = columns
        self.keys, self.values = self.kv()
        return self.keys, self.values


@dataclass
class DecodeBatch(Generic[Row]):
    rows: list[Row]
    cache: Cache
    #: ``[rows, columns]``: 1 where a row has a token.
    attention_mask: torch.Tensor
    #: ``[rows]``: the token each row feeds to the next step (its last sampled one).
    next_ids: torch.Tensor

    @classmethod
    def prefill(
        cls,
        model: Any,
        rows: list[Row],
        prompts: Sequence[torch.Tensor],
        reuse: Sequence[Reuse],
        pad_id: int,
    ) -> tuple[DecodeBatch[Row], torch.Tensor]:
        """Run each prompt past its reused head; return the batch and its last fp32 logits.

        The next ids are left at ``pad_id``: set them to the tokens sampled from the logits.
        """
        device = model.device
        suffixes = [prompt[length:] for prompt, (_, length) in zip(prompts, reuse, strict=True)]
        ids, suffix_mask = _left_pad(suffixes, pad_id, device)
        head = max(length for _, length in reuse)
        past = _stack_heads(reuse, head, ids.shape[1], model.config.num_hidden_layers)
        head_mask = torch.zeros((len(rows), head), dtype=torch.long, device=device)
        for index, (_, length) in enumerate(reuse):
            head_mask[index, head - length :] = 1
        lengths = torch.tensor([length for _, length in reuse], device=device)
        positions = lengths[:, None] + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        attention_mask = torch.cat([head_mask, suffix_mask], dim=1)
        out = model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_argument(model): past},
        )
        next_ids = torch.full((len(rows),), pad_id, dtype=torch.long, device=device)
        batch = cls(list(rows), past, attention_mask, next_ids)
        return batch, out.logits[:, -1, :].float()

    def step(self, model: Any) -> torch.Tensor:
        """Feed every row its next id; return the fp32 logits of the next tokens."""
        positions = self.attention_mask.sum(-1, keepdim=True)  # each row's tokens so far
        self.attention_mask = torch.nn.functional.pad(self.attention_mask, (0, 1), value=1)
        out = model(
            input_ids=self.next_ids[:, None],
            attention_mask=self.attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{cache_argument(model): self.cache},
        )
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def merge(self, other: DecodeBatch[Row]) -> DecodeBatch[Row]:
        """Both batches' rows in one, right-aligned on the wider one's columns."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        pairs = zip(_growing(self.cache), _growing(other.cache), strict=True)
        cache = Cache(layers=[GrowingLayer([a.kv(), b.kv()], width) for a, b in pairs])
        masks = [self.attention_mask, other.attention_mask]
        mask = torch.cat([_pad_mask(m, width) for m in masks])
        next_ids = torch.cat([self.next_ids, other.next_ids])
        return DecodeBatch(self.rows + other.rows, cache, mask, next_ids)

    def select(self, keep: list[int]) -> DecodeBatch[Row] | None:
        """The rows at ``keep`` (None if none), without the columns none of them uses."""
        if not keep:
            return None
        index = torch.tensor(keep, device=self.attention_mask.device)
        mask = self.attention_mask[index]
        start = int(mask.any(0).nonzero()[0])
        width = mask.shape[1] - start
        kvs = [layer.kv() for layer in _growing(self.cache)]
        cache = Cache(
            layers=[
                GrowingLayer([(k[index, :, start:], v[index, :, start:])], width) for k, v in kvs
            ]
        )
        rows = [self.rows[i] for i in keep]
        return DecodeBatch(rows, cache, mask[:, start:], self.next_ids[index])

    def row_prefix(self, row: int, sequence: list[int]) -> CachedPrefix:
        """Row ``row``'s KV as a cache entry: the head of ``sequence`` (its prompt and output)
        that it covers (the last sampled token has usually not run yet)."""
        columns = self.attention_mask[row].nonzero().squeeze(1)
        if len(columns) > len(sequence):
            raise RuntimeError(f"row holds {len(columns)} tokens of KV, not {len(sequence)}")
        token_ids = torch.tensor(sequence[: len(columns)], dtype=torch.long)
        kvs = [layer.kv() for layer in _growing(self.cache)]
        kv = [(k[row : row + 1, :, columns], v[row : row + 1, :, columns]) for k, v in kvs]
        return CachedPrefix(token_ids, DynamicCache(kv))


def extend_prefix(model: Any, base: Reuse, token_ids: torch.Tensor) -> CachedPrefix:
    """A cache entry for ``token_ids``: ``base``'s head reused, the rest computed here."""
    entry, length = base
    past = DynamicCache(entry.kv_head(length)) if entry is not None and length else None
    ids = token_ids[None, length:].to(model.device)
    positions = torch.arange(length, len(token_ids), device=model.device)[None]
    kv = cache_argument(model)
    out = model(
        input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1, **{kv: past}
    )
    return CachedPrefix(token_ids, out[kv])


def cache_argument(model: Any) -> str:
    """What ``model``'s forward calls its KV cache, in and out: ``cache`` from transformers
    5.24, ``past_key_values`` before (5.24 still takes the old name, with a FutureWarning)."""
    forward: Callable[..., Any] = type(model).forward
    return _cache_argument(forward)


@functools.cache
def _cache_argument(forward: Callable[..., Any]) -> str:
    parameters = inspect.signature(forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _growing(cache: Cache) -> list[GrowingLayer]:
    """A batch's cache layers, typed as they are: it builds its caches of ``GrowingLayer``s
    only (``_stack_heads``, ``merge``, ``select``), where HF types any kind of layer."""
    layers = [layer for layer in cache.layers if isinstance(layer, GrowingLayer)]
    if len(layers) != len(cache.layers):
        raise TypeError("a decode batch's cache holds a layer that is not a GrowingLayer")
    return layers


def _stack_heads(reuse: Sequence[Reuse], width: int, suffix: int, layers: int) -> Cache:
    """The reused heads as one cache of ``width`` columns, each row's right-aligned, with room
    for ``suffix`` more columns and some decode steps."""
    room = suffix + _ROOM
    if width == 0:  # the prefill's first update allocates
        return Cache(layers=[GrowingLayer() for _ in range(layers)])
    template = next(entry for entry, length in reuse if entry is not None and length)
    nothing = template.kv_head(0)
    heads = [entry.kv_head(length) if entry is not None else nothing for entry, length in reuse]
    return Cache(
        layers=[
            GrowingLayer([head[layer] for head in heads], width, room)
            for layer in range(len(nothing))
        ]
    )


def _left_pad(
    rows: Sequence[torch.Tensor], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = row
        mask[index, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))
