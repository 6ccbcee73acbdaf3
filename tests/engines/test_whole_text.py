"""Text decoded in whole characters: a character spread over tokens shows once complete, and a
stop string matches only characters the answer has (U+FFFD included)."""

from __future__ import annotations

from rollway.engines.whole_text import WholeText, first_stop

#: A byte-level vocabulary: the smiley's four bytes over three tokens, as BPE spreads emoji.
VOCAB = {0: b"a", 1: b"\xf0\x9f", 2: b"\x98", 3: b"\x80", 4: b"\xef\xbf\xbd", 5: b"b"}


def decode(ids: list[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def test_a_character_over_three_tokens_is_added_once_complete() -> None:
    text = WholeText(decode)
    assert [text.push(i) for i in (0, 1, 2, 3, 5)] == ["a", "", "", "\U0001f600", "b"]
    assert text.text == "a\U0001f600b"


def test_a_replacement_character_the_model_sampled_counts_once_a_token_follows() -> None:
    text = WholeText(decode)
    assert [text.push(i) for i in (0, 4, 5)] == ["a", "", "\ufffdb"]


def test_a_stop_string_is_not_found_in_a_character_cut_short() -> None:
    assert first_stop(decode([0, 1, 2]), ["\ufffd"]) is None  # the answer ended inside it
    assert first_stop(decode([0, 4, 5]), ["\ufffd", "b"]) == (1, "\ufffd")
    assert first_stop("xyzab", ["b", "za"]) == (2, "za")
