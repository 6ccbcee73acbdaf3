"""The prefix cache on its own: longest-prefix lookup, a token budget, LRU eviction."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import DynamicCache

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.embedded.decode_batch import cache_argument
from rollway.engines.embedded.kv_cache import CachedPrefix, PrefixCache, common_prefix_length


def entry(*token_ids: int) -> CachedPrefix:
    """Token ids and fake KV (two layers, one head) whose values are the token ids."""
    values = torch.tensor(token_ids, dtype=torch.float32).reshape(1, 1, -1, 1)
    return CachedPrefix(torch.tensor(token_ids), DynamicCache([(values, values)] * 2))


def ids(*token_ids: int) -> torch.Tensor:
    return torch.tensor(token_ids)


def test_common_prefix_length_counts_the_shared_leading_ids() -> None:
    assert common_prefix_length(ids(1, 2, 3), ids(1, 2, 4, 5)) == 2
    assert common_prefix_length(ids(1, 2), ids(1, 2, 3)) == 2
    assert common_prefix_length(ids(7), ids(8)) == 0


def test_a_lookup_finds_the_longest_shared_prefix_and_its_kv() -> None:
    cache = PrefixCache(max_tokens=100)
    short, long = entry(1, 2, 9), entry(1, 2, 3, 4, 5)
    cache.insert(short)
    cache.insert(long)
    found, length = cache.match(ids(1, 2, 3, 4, 6, 7))
    assert found is long and length == 4
    keys, _ = found.kv_head(length)[0]
    assert keys.flatten().tolist() == [1, 2, 3, 4]
    assert cache.match(ids(5, 5)) == (None, 0)
    assert (cache.lookups, cache.hits) == (2, 1)


def test_the_least_recently_used_entry_goes_first_when_the_budget_is_spent() -> None:
    cache = PrefixCache(max_tokens=6)
    first, second = entry(1, 1, 1), entry(2, 2, 2)
    cache.insert(first)
    cache.insert(second)
    cache.match(ids(1, 1))  # ``first`` is now the most recently used
    cache.insert(entry(3, 3))
    assert cache.match(ids(2, 2, 2)) == (None, 0)  # ``second`` was evicted
    assert cache.match(ids(1, 1, 1))[1] == 3
    assert cache.tokens == 5 and len(cache) == 2


def test_an_entry_covered_by_another_is_not_kept_twice() -> None:
    cache = PrefixCache(max_tokens=100)
    turn_one, turn_two = entry(1, 2, 3), entry(1, 2, 3, 4, 5)
    cache.insert(turn_one)
    cache.insert(turn_two)  # turn two's prompt starts with turn one: it serves both
    assert len(cache) == 1 and cache.tokens == 5
    cache.insert(entry(1, 2))  # covered by what the cache holds: nothing new
    assert len(cache) == 1 and cache.match(ids(1, 2, 3))[0] is turn_two


def test_an_entry_larger_than_the_budget_is_refused_and_zero_turns_the_cache_off() -> None:
    cache = PrefixCache(max_tokens=2)
    assert not cache.accepts(3)
    cache.insert(entry(1, 2, 3))
    assert len(cache) == 0
    off = PrefixCache(max_tokens=0)
    off.insert(entry(1))
    assert len(off) == 0 and not off.accepts(1)
    with pytest.raises(ValueError, match="negative"):
        PrefixCache(max_tokens=-1)


def test_clear_drops_every_entry() -> None:
    cache = PrefixCache(max_tokens=10)
    cache.insert(entry(1, 2))
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0 and cache.match(ids(1, 2)) == (None, 0)


class _RenamedForward:
    def forward(self, input_ids: object = None, cache: object = None) -> None: ...


class _OlderForward:
    def forward(self, input_ids: object = None, past_key_values: object = None) -> None: ...


def test_the_kv_argument_is_named_as_the_installed_models_forward_names_it(
    engine: EmbeddedEngine,
) -> None:
    assert cache_argument(_RenamedForward()) == "cache"  # transformers 5.24 and later
    assert cache_argument(_OlderForward()) == "past_key_values"
    # The name picked for the real model is the one it takes without a deprecation warning.
    name = cache_argument(engine.model)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error")
        ids = torch.tensor([[1, 2, 3]], device=engine.model.device)
        out = engine.model(ids, use_cache=True, **{name: None})
        assert out[name].get_seq_length() == 3
