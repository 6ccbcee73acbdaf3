"""The agreement figures of benchmarks/llamacpp_compare.py: greedy ids compared over their first
N tokens, a completion that stopped early compared as it is."""

from __future__ import annotations

from benchmarks.llamacpp_compare import agreement, common_prefix_length


def test_common_prefix_length_stops_at_the_first_difference_or_the_shorter_end() -> None:
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([5], [6]) == 0
    assert common_prefix_length([], [1]) == 0


def test_agreement_counts_prompts_equal_over_the_first_n_ids() -> None:
    ours = [[1, 2, 3, 4], [1, 2, 3], [7, 8, 9, 9], [4, 4]]
    theirs = [[1, 2, 3, 5], [1, 2, 3], [7, 0, 9, 9], [4, 4, 4]]
    # First 3 ids: equal, equal, differ at 1, stopped early (length 2 against 3).
    equal, mean_prefix = agreement(ours, theirs, 3)
    assert equal == 2 / 4
    assert mean_prefix == (3 + 3 + 1 + 2) / 4
    # Over the first id only every prompt agrees.
    assert agreement(ours, theirs, 1) == (1.0, 1.0)
