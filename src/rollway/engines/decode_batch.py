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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch.nn import functional
from transformers import DynamicCache

from rollway.engines.kv_cache import CachedPrefix

Row = TypeVar("Row")
#: Per layer, the keys and values of a batch: ``[rows, kv_heads, columns, head_dim]`` each.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
#: A prompt's reusable head: the entry holding its KV (None: nothing reused) and its length.
Reuse = tuple[CachedPrefix | None, int]


@dataclass
class DecodeBatch(Generic[Row]):
    rows: list[Row]
    cache: DynamicCache
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
        head = max(length for _, length in reuse)
        past, head_mask = _stack_heads(reuse, head, device)
        suffixes = [prompt[length:] for prompt, (_, length) in zip(prompts, reuse, strict=True)]
        ids, suffix_mask = _left_pad(suffixes, pad_id, device)
        lengths = torch.tensor([length for _, length in reuse], device=device)
        positions = lengths[:, None] + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        attention_mask = torch.cat([head_mask, suffix_mask], dim=1)
        out = model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        next_ids = torch.full((len(rows),), pad_id, dtype=torch.long, device=device)
        batch = cls(list(rows), out.past_key_values, attention_mask, next_ids)
        return batch, out.logits[:, -1, :].float()

    def step(self, model: Any) -> torch.Tensor:
        """Feed every row its next id; return the fp32 logits of the next tokens."""
        positions = self.attention_mask.sum(-1, keepdim=True)  # each row's tokens so far
        self.attention_mask = functional.pad(self.attention_mask, (0, 1), value=1)
        out = model(
            input_ids=self.next_ids[:, None],
            attention_mask=self.attention_mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :].float()

    def merge(self, other: DecodeBatch[Row]) -> DecodeBatch[Row]:
        """Both batches' rows in one, right-aligned on the wider one's columns."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        layers = [
            (torch.cat([_pad_columns(k, width), _pad_columns(ok, width)]),
             torch.cat([_pad_columns(v, width), _pad_columns(ov, width)]))
            for (k, v, _), (ok, ov, _) in zip(self.cache, other.cache, strict=True)
        ]  # fmt: skip
        mask = torch.cat(
            [_pad_columns(self.attention_mask, width), _pad_columns(other.attention_mask, width)]
        )
        next_ids = torch.cat([self.next_ids, other.next_ids])
        return DecodeBatch(self.rows + other.rows, DynamicCache(layers), mask, next_ids)

    def select(self, keep: list[int]) -> DecodeBatch[Row] | None:
        """The rows at ``keep`` (None if none), without the columns none of them uses."""
        if not keep:
            return None
        index = torch.tensor(keep, device=self.attention_mask.device)
        mask = self.attention_mask[index]
        start = int(mask.any(0).nonzero()[0])
        layers = [(k[index, :, start:], v[index, :, start:]) for k, v, _ in self.cache]
        rows = [self.rows[i] for i in keep]
        return DecodeBatch(rows, DynamicCache(layers), mask[:, start:], self.next_ids[index])

    def row_prefix(self, row: int, sequence: list[int]) -> CachedPrefix:
        """Row ``row``'s KV as a cache entry: the head of ``sequence`` (its prompt and output)
        that it covers (the last sampled token has usually not run yet)."""
        columns = self.attention_mask[row].nonzero().squeeze(1)
        if len(columns) > len(sequence):
            raise RuntimeError(f"row holds {len(columns)} tokens of KV, not {len(sequence)}")
        token_ids = torch.tensor(sequence[: len(columns)], dtype=torch.long)
        layers = [
            (k[row : row + 1, :, columns], v[row : row + 1, :, columns]) for k, v, _ in self.cache
        ]
        return CachedPrefix(token_ids, DynamicCache(layers))


def extend_prefix(model: Any, base: Reuse, token_ids: torch.Tensor) -> CachedPrefix:
    """A cache entry for ``token_ids``: ``base``'s head reused, the rest computed here."""
    entry, length = base
    past = DynamicCache(entry.kv_head(length)) if entry is not None and length else None
    ids = token_ids[None, length:].to(model.device)
    positions = torch.arange(length, len(token_ids), device=model.device)[None]
    out = model(
        input_ids=ids,
        position_ids=positions,
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
    )
    return CachedPrefix(token_ids, out.past_key_values)


def _stack_heads(
    reuse: Sequence[Reuse], width: int, device: torch.device
) -> tuple[DynamicCache | None, torch.Tensor]:
    """The reused heads as one right-aligned cache of ``width`` columns, and its mask."""
    mask = torch.zeros((len(reuse), width), dtype=torch.long, device=device)
    for index, (_, length) in enumerate(reuse):
        mask[index, width - length :] = 1
    if width == 0:
        return None, mask
    template = next(entry for entry, length in reuse if entry is not None and length)
    empty = [(k[..., :0, :], v[..., :0, :]) for k, v in template.kv_head(0)]
    heads = [entry.kv_head(length) if entry is not None else empty for entry, length in reuse]
    layers = [
        (torch.cat([_pad_columns(head[layer][0], width) for head in heads]),
         torch.cat([_pad_columns(head[layer][1], width) for head in heads]))
        for layer in range(len(empty))
    ]  # fmt: skip
    return DynamicCache(layers), mask


def _left_pad(rows: Sequence[torch.Tensor], pad_id: int, device: torch.device):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = row
        mask[index, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def _pad_columns(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` with zero columns on the left up to ``width`` (dim -2 for KV, -1 for masks)."""
    if tensor.dim() == 2:
        return functional.pad(tensor, (width - tensor.shape[-1], 0))
    return functional.pad(tensor, (0, 0, width - tensor.shape[-2], 0))
