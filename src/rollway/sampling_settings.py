"""One declaration of each sampling setting: its name, type, range, default and meaning.

Every surface that takes sampling is made from ``SETTINGS``, so they all refuse the same value
with the same words naming the field: ``SamplingParams`` in process (and the client's keywords
and mappings), the gateway's HTTP schemas (chat completions, responses, Anthropic messages, the
register body, an agent server's init), ``rollway run``'s options and its ``--config`` file, and
the table in docs/agents.md. The ranges are what both OpenAI's API and vLLM accept
(temperature 0 to 2, top_p above 0 to 1, max_tokens at least 1, top_logprobs 0 to 20).
No third-party imports: trainers' processes read it without the server stack."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from rollway.errors import InvalidFieldsError

#: The most top logprobs a turn records per token (OpenAI's and vLLM's chat cap).
MAX_TOP_LOGPROBS = 20
#: The largest token id anything accepts: engines keep ids as int32.
MAX_TOKEN_ID = 2**31 - 1
#: A 64-bit seed: what engines (torch, SGLang, vLLM) accept.
SEED_RANGE = (-(2**63), 2**63 - 1)

#: ``number``: a real number (an int stands for a float; not a bool, not NaN or infinite);
#: ``whole``: an int, not a bool; ``flag``: True or False; ``texts``/``token_ids``: one or a
#: list of stop strings or token ids.
Kind = Literal["number", "whole", "flag", "texts", "token_ids"]


@dataclass(frozen=True, slots=True)
class SamplingSetting:
    """One setting. ``low``/``high`` bound a number (``above_low``: ``low`` itself is
    refused); ``off`` is another value meaning the default, made the default once, here
    (vLLM's ``top_k=-1``); ``optional``: None is a value (unset: the engine's own)."""

    name: str
    kind: Kind
    default: Any
    meaning: str
    low: int | float | None = None
    high: int | float | None = None
    above_low: bool = False
    off: int | None = None
    optional: bool = False

    @property
    def rule(self) -> str:
        """What a value must be, in the words every refusal uses."""
        if self.kind == "flag":
            return "must be true or false"
        if self.kind == "texts":
            return "must be a string or a list of non-empty strings"
        if self.kind == "token_ids":
            return f"must be a token id or a list of token ids from 0 to {MAX_TOKEN_ID}"
        noun = "a number" if self.kind == "number" else "a whole number"
        return f"must be {noun} {self.range_words}"

    @property
    def range_words(self) -> str:
        low, high = _plain(self.low), _plain(self.high)
        if self.above_low:
            return f"above {low} and at most {high}"
        if high is None:
            return f"of at least {low}"
        return f"from {low} to {high}"

    def check(self, value: Any, field: str | None = None) -> Any:
        """``value`` as the setting holds it (-1 made 0 for ``top_k``, stop as a tuple), or an
        ``InvalidFieldsError`` naming ``field`` (default: the setting's name)."""
        field = field or self.name
        if value is None and self.optional:
            return None
        if self.kind == "texts":
            return stop_strings(value, field)
        if self.kind == "token_ids":
            return stop_token_ids(value, field)
        if not self._fits(value):
            raise InvalidFieldsError(f"{field}: {self.rule}, not {value!r}", param=field)
        return self.default if value == self.off else value

    def _fits(self, value: Any) -> bool:
        if self.kind == "flag":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "whole" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        low, high = self.low, self.high
        above = low is None or value > low or (value == low and not self.above_low)
        return above and (high is None or value <= high)


SETTINGS: tuple[SamplingSetting, ...] = (
    SamplingSetting(
        "temperature",
        "number",
        1.0,
        "Sampling temperature (0: greedy).",
        low=0.0,
        high=2.0,
    ),
    SamplingSetting(
        "top_p",
        "number",
        1.0,
        "Nucleus sampling: the smallest set of tokens holding this much probability (1: off).",
        low=0.0,
        high=1.0,
        above_low=True,
    ),
    SamplingSetting(
        "top_k",
        "whole",
        0,
        "Top-k sampling: the k most likely tokens (0 or -1: off).",
        low=-1,
        off=-1,
    ),
    SamplingSetting(
        "max_tokens",
        "whole",
        None,
        "The most tokens one model call samples (unset: up to the rollout's limits).",
        low=1,
        optional=True,
    ),
    SamplingSetting(
        "stop",
        "texts",
        (),
        "Stop strings: an answer ends where one is sampled.",
    ),
    SamplingSetting(
        "stop_token_ids",
        "token_ids",
        (),
        "Token ids that end an answer, beside the model's own end tokens.",
    ),
    SamplingSetting(
        "seed",
        "whole",
        None,
        "Sampling seed (64-bit); a rollout's turns and a run's rollouts derive theirs from it.",
        low=SEED_RANGE[0],
        high=SEED_RANGE[1],
        optional=True,
    ),
    SamplingSetting(
        "top_logprobs",
        "whole",
        0,
        "Record each sampled token's N most likely tokens and their logprobs.",
        low=0,
        high=MAX_TOP_LOGPROBS,
    ),
    SamplingSetting(
        "record_entropy",
        "flag",
        False,
        "Record each sampled token's entropy (engines that see the logits).",
    ),
)
SETTING = {setting.name: setting for setting in SETTINGS}
SAMPLING_NAMES = tuple(SETTING)


def checked(values: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each of ``values`` (setting names) checked by its setting's rule, as it is held."""
    for name, value in values.items():
        yield name, SETTING[name].check(value)


def stop_strings(value: Any, field: str = "stop") -> tuple[str, ...]:
    """``stop`` as a tuple, checked: one string is a tuple of one (``stop="</answer>"`` is not
    one stop string per character), and an empty one would end every answer before it began."""
    items = _items(value, str)
    if items is None or "" in items:
        raise InvalidFieldsError(f"{field}: {SETTING['stop'].rule}, not {value!r}", param=field)
    return items


def stop_token_ids(value: Any, field: str = "stop_token_ids") -> tuple[int, ...]:
    """``stop_token_ids`` as a tuple, checked: ids from 0 to ``MAX_TOKEN_ID`` (an int32, what
    engines take); the gateway also checks them against its model's vocabulary."""
    items = _items(value, int)
    if items is None or not all(0 <= i <= MAX_TOKEN_ID for i in items):
        raise InvalidFieldsError(
            f"{field}: {SETTING['stop_token_ids'].rule}, not {value!r}", param=field
        )
    return items


def _items(value: Any, kind: type) -> tuple[Any, ...] | None:
    """``value`` as a tuple of ``kind`` (a lone one: a tuple of one); None: it is not."""
    if isinstance(value, kind) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):
        return None
    items = value if isinstance(value, tuple) else tuple(value)
    ok = all(isinstance(i, kind) and not isinstance(i, bool) for i in items)
    return items if ok else None


def docs_table() -> str:
    """The table docs/agents.md shows (a test holds it to this)."""
    rows = ["| setting | type | range | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        kind = {"number": "number", "whole": "whole number", "flag": "bool"}.get(s.kind)
        span = s.range_words.removeprefix("of ") if kind in ("number", "whole number") else "-"
        if s.kind == "texts":
            kind, span = "strings", "non-empty"
        elif s.kind == "token_ids":
            kind, span = "token ids", f"0 to {MAX_TOKEN_ID}"
        default = "unset" if s.default is None else "none" if s.default == () else s.default
        rows.append(f"| `{s.name}` | {kind} | {span} | {default} | {s.meaning} |")
    return "\n".join(rows)


def _plain(bound: int | float | None) -> str | None:
    return None if bound is None else f"{bound:g}" if isinstance(bound, float) else str(bound)
