"""The trajectory's stored format: turns that grow linearly with the conversation, their
checks, each turn's whole prompt on demand, and records of the previous format read into this
one. The training samples are made from the turns by ``rollway.samples``.

Format 2 (this one): a turn keeps the prompt ids past the previous turn of its segment (that
turn's prompt and completion): the template glue and the new messages; the turn that starts
a segment keeps its whole prompt. A 100-turn rollout's record then holds its context once,
where format 1 held every turn's whole prompt (50 times the context). Each turn's
``prompt_hash`` is still of its whole prompt: ``check_prompt_hashes`` proves the chain.

Format 1 (no ``format_version``; ``samples`` stored): every turn's whole ``prompt_ids``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Protocol


class Turn(Protocol):
    """What this module and ``rollway.samples`` read of a turn (``rollway.trajectory.Turn``,
    which imports both)."""

    index: int
    segment: int
    prompt_len: int
    new_prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    prompt_hash: str
    policy_versions: list[int] | None
    raw_logprobs: list[float] | None
    kept_mass: list[float] | None

    @property
    def logprob_kind(self) -> str: ...  # read-only: a turn's is one of types.LogprobKind

    # Read-only: a turn keeps them in its ``distribution``.
    @property
    def top_ids(self) -> list[list[int]] | None: ...

    @property
    def top_logprobs(self) -> list[list[float]] | None: ...

    @property
    def entropy(self) -> list[float] | None: ...


FORMAT_VERSION = 2


def whole_prompts(turns: Sequence[Turn]) -> Iterator[tuple[Turn, list[int]]]:
    """Each turn with its whole prompt, in turn order (each list is the turn's own)."""
    sequences: dict[int, list[int]] = {}
    for turn in turns:
        head = sequences.get(turn.segment, [])
        prompt = head + turn.new_prompt_ids
        sequences[turn.segment] = prompt + turn.completion_ids
        yield turn, prompt


def whole_prompt(turns: Sequence[Turn], index: int) -> list[int]:
    """The whole prompt the engine got on turn ``index``."""
    segment = turns[index].segment
    ids: list[int] = []
    for turn in turns[: index + 1]:
        if turn.segment == segment:
            ids += turn.new_prompt_ids
            if turn.index != index:
                ids += turn.completion_ids
    return ids


def check_turns(turns: Sequence[Turn]) -> list[str]:
    """What is wrong with the turns' token data, by turn (empty: nothing): per-token lists that
    are not one per completion id, ids outside int32, and a broken chain of prompts
    (``check_prompt_hashes``). A sample made from such turns would pair tokens with the
    wrong logprobs, versions or masks."""
    problems = [problem for turn in turns for problem in _turn_problems(turn)]
    return problems or check_prompt_hashes(turns)


#: A turn's lists that hold one value per completion id, where it has them.
_PER_TOKEN = (
    "logprobs",
    "policy_versions",
    "raw_logprobs",
    "kept_mass",
    "top_ids",
    "top_logprobs",
    "entropy",
)
_INT32_END = 2**31


def _turn_problems(turn: Turn) -> Iterator[str]:
    tokens = len(turn.completion_ids)
    for name in _PER_TOKEN:
        values = getattr(turn, name)
        if values is not None and len(values) != tokens:
            yield f"turn {turn.index}: {len(values)} {name} for {tokens} completion ids"
    top_ids, top_logprobs = turn.top_ids, turn.top_logprobs
    if (top_ids is None) != (top_logprobs is None) or any(
        len(ids) != len(logprobs)
        for ids, logprobs in zip(top_ids or (), top_logprobs or (), strict=False)
    ):
        yield f"turn {turn.index}: its top_logprobs are not one per top id"
    top = [i for ids in top_ids or () for i in ids]
    for name, ids in (("prompt", turn.new_prompt_ids), ("completion", turn.completion_ids)):
        if ids and (min(ids) < 0 or max(ids) >= _INT32_END):
            yield f"turn {turn.index}: a {name} id outside 0 to 2**31 - 1"
    if top and (min(top) < 0 or max(top) >= _INT32_END):
        yield f"turn {turn.index}: a top id outside 0 to 2**31 - 1"


def check_prompt_hashes(turns: Sequence[Turn]) -> list[str]:
    """The turns whose whole prompt, rebuilt from the chain, does not hash to the recorded
    ``prompt_hash`` or is not ``prompt_len`` long (empty: the chain holds). Linear time: each
    segment's hash state moves on by each turn's new ids. For token ids only: behind a
    chat-level engine (``has_token_ids`` false) turns hold none to check."""
    problems = []
    states: dict[int, tuple[Any, int]] = {}
    for turn in turns:
        state, length = states.get(turn.segment, (hashlib.sha256(), 0))
        state.update(int32_bytes(turn.new_prompt_ids))
        length += len(turn.new_prompt_ids)
        if length != turn.prompt_len:
            problems.append(f"turn {turn.index}: its prompt is {length} ids, not {turn.prompt_len}")
        elif state.hexdigest()[:16] != turn.prompt_hash:
            problems.append(f"turn {turn.index}: prompt does not match its prompt_hash")
        state = state.copy()
        state.update(int32_bytes(turn.completion_ids))
        states[turn.segment] = (state, length + len(turn.completion_ids))
    return problems


def prompt_hash(ids: list[int]) -> str:
    """sha256 (hex, first 16) of the ids as int32."""
    return hashlib.sha256(int32_bytes(ids)).hexdigest()[:16]


def int32_bytes(ids: list[int]) -> bytes:
    return array("i", ids).tobytes()


def upgrade(data: Any) -> Any:
    """A trajectory as read (a dict) in this format: a format-1 one (whole prompts on every
    turn, samples stored) has each turn's prompt cut to what it adds to its segment and its
    samples dropped (they are made from the turns). Anything else passes as it is."""
    if not isinstance(data, dict):
        return data
    version = data.get("format_version", 1 if "samples" in data else FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"format_version must be an integer, not {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"trajectory format {version} is newer than this rollway reads (1 to "
            f"{FORMAT_VERSION}): upgrade rollway"
        )
    if version == FORMAT_VERSION:
        return data
    upgraded = {key: value for key, value in data.items() if key != "samples"}
    upgraded["format_version"] = FORMAT_VERSION
    turns = data.get("turns")
    if isinstance(turns, list):
        upgraded["turns"] = list(cut_prompts(turns))
    return upgraded


def cut_prompts(turns: list[Any]) -> Iterator[Any]:
    """Turns with whole ``prompt_ids`` (format 1, or a test's) with each prompt cut to its new ids
    (``new_prompt_ids``) and its length kept (``prompt_len``); a turn that does not extend
    the previous turn of its segment is an error (its record's samples were wrong too)."""
    sequences: dict[Any, list[Any]] = {}
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("prompt_ids"), list):
            yield turn  # the model's own check names what is wrong
            continue
        prompt = turn["prompt_ids"]
        head = sequences.get(turn.get("segment"), [])
        if prompt[: len(head)] != head:
            raise ValueError(
                f"turn {turn.get('index')} does not extend the previous turn of segment "
                f"{turn.get('segment')}"
            )
        new = {key: value for key, value in turn.items() if key != "prompt_ids"}
        new["prompt_len"] = len(prompt)
        new["new_prompt_ids"] = prompt[len(head) :]
        sequences[turn.get("segment")] = prompt + list(turn.get("completion_ids") or [])
        yield new
