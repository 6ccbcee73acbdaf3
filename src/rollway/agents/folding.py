"""Context folding: an agent keeps its conversation under a token budget by folding its history
(keeping the last turns, dropping old tool outputs, or having the policy model summarise them).

An agent calls the model through a ``ContextFolding`` instead of ``ctx.chat``::

    folding = ContextFolding(budget=3000, policies=[DropToolOutputs(), KeepLastTurns(3)])
    reply = await folding.chat(ctx, messages, max_tokens=64)  # folds ``messages`` in place

While the conversation fits, each call extends the last (one segment, as without folding). A
fold rewrites the history, so the next turn starts a new segment: the gateway records each
segment exactly and the export gives one sample per segment, tied to its rollout and group
(docs/trainers.md says how a trainer shares the rollout's reward among them). A summary is a
model call of its own, recorded like any other turn.

The budget is checked on an estimate that needs no tokenizer in the agent: the gateway's exact
count for what the last call sent and got back, plus the new messages at the characters per
token that call showed (``Footprint``), padded by ``margin``.
"""

from __future__ import annotations

import copy
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollway.agents.context import RolloutContext
from rollway.errors import ConfigError
from rollway.generation import ChatResult, Message

log = logging.getLogger(__name__)
#: Tokens the chat template adds around each message (role markers): a generous allowance.
TEMPLATE_TOKENS_PER_MESSAGE = 8


def message_chars(message: Message) -> int:
    """The characters a message puts in the prompt: its text and its tool calls."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content else ""
    calls = message.get("tool_calls") or ()
    return len(text) + sum(len(json.dumps(call.get("function", {}))) for call in calls)


@dataclass
class Footprint:
    """The prompt tokens a conversation will take, estimated from the last call: its prompt and
    answer are counted exactly by the gateway; messages after them at the characters per token
    that call's prompt had (``chars_per_token`` until a call is seen)."""

    chars_per_token: float = 3.0
    sent: list[Message] = field(default_factory=list)
    tokens: int = 0

    def observe(self, sent: list[Message], reply: ChatResult) -> None:
        chars = sum(map(message_chars, sent))
        if reply.prompt_tokens > 0 and chars > 0:
            self.chars_per_token = max(1.0, chars / reply.prompt_tokens)
        self.sent = [*sent, reply.message]
        self.tokens = reply.prompt_tokens + reply.completion_tokens

    def estimate(self, messages: list[Message]) -> int:
        known = len(self.sent)
        if self.sent and messages[:known] == self.sent:
            base, new = self.tokens, messages[known:]
        else:  # the history changed since the last call: estimate all of it
            base, new = 0, messages
        chars = sum(map(message_chars, new))
        return base + int(chars / self.chars_per_token) + TEMPLATE_TOKENS_PER_MESSAGE * len(new)


class FoldPolicy(ABC):
    """One way to fold a conversation. ``fold`` returns a shorter conversation (or the same one
    when it has nothing left to fold); ``ContextFolding`` tries its policies in order until the
    estimate fits the budget."""

    @abstractmethod
    async def fold(
        self, ctx: RolloutContext, messages: list[Message], fits: FitCheck
    ) -> list[Message]: ...


class FitCheck:
    """Whether a conversation fits the budget (``fits(messages)``), and by how much it does not."""

    def __init__(self, footprint: Footprint, budget: int) -> None:
        self.footprint, self.budget = footprint, budget

    def __call__(self, messages: list[Message]) -> bool:
        return self.footprint.estimate(messages) <= self.budget

    def tokens(self, messages: list[Message]) -> int:
        return self.footprint.estimate(messages)


def split_history(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """The head (leading system messages and the first user message: the task) and the rest as
    exchanges: each assistant message with the tool results and user messages after it, so a
    tool call is never kept without its result or the other way round."""
    head_end = 0
    while head_end < len(messages) and messages[head_end]["role"] in ("system", "developer"):
        head_end += 1
    if head_end < len(messages) and messages[head_end]["role"] == "user":
        head_end += 1
    head = messages[:head_end]
    exchanges: list[list[Message]] = []
    for message in messages[head_end:]:
        if message["role"] == "assistant" or not exchanges:
            exchanges.append([message])
        else:
            exchanges[-1].append(message)
    return head, exchanges


def folded_note(count: int) -> Message:
    return {"role": "user", "content": f"[{count} earlier messages were folded away.]"}


@dataclass(frozen=True)
class KeepLastTurns(FoldPolicy):
    """Keep the task (the head) and the last ``turns`` exchanges, fewer where even those do not
    fit (one at least); a note says how many messages went."""

    turns: int = 4

    async def fold(
        self, ctx: RolloutContext, messages: list[Message], fits: FitCheck
    ) -> list[Message]:
        head, exchanges = split_history(messages)
        for keep in range(min(self.turns, len(exchanges)), 0, -1):
            kept = [m for exchange in exchanges[-keep:] for m in exchange]
            dropped = len(messages) - len(head) - len(kept)
            folded = [*head, folded_note(dropped), *kept] if dropped else messages
            if fits(folded) or keep == 1:
                return folded
        return messages


@dataclass(frozen=True)
class DropToolOutputs(FoldPolicy):
    """Replace the text of tool results, oldest first, by a note of its size, until the
    conversation fits; the last ``keep_last`` results stay whole."""

    keep_last: int = 1

    async def fold(
        self, ctx: RolloutContext, messages: list[Message], fits: FitCheck
    ) -> list[Message]:
        folded = list(messages)
        results = [i for i, m in enumerate(folded) if m["role"] == "tool"]
        for i in results[: max(0, len(results) - self.keep_last)]:
            chars = message_chars(folded[i])
            if chars > 80:
                note = f"[tool output of {chars} characters dropped]"
                folded[i] = {**folded[i], "content": note}
            if fits(folded):
                break
        return folded


SUMMARY_REQUEST = (
    "Summarize the earlier steps of this task below in a few sentences: what was done, what "
    "was found, and what is left. Keep every number, name and code exactly."
)


@dataclass(frozen=True)
class SummarizeOlder(FoldPolicy):
    """Have the policy model itself summarise all but the last ``keep_last`` exchanges (a model
    call recorded as its own turn, at most ``max_tokens``), and keep the head, the summary and
    those exchanges. The folded text sent for summary is cut to fit the budget; where the task
    alone leaves no room to ask, it folds nothing (put a ``KeepLastTurns`` after it)."""

    keep_last: int = 2
    max_tokens: int = 128
    request: str = SUMMARY_REQUEST

    async def fold(
        self, ctx: RolloutContext, messages: list[Message], fits: FitCheck
    ) -> list[Message]:
        head, exchanges = split_history(messages)
        keep = min(self.keep_last, max(len(exchanges) - 1, 0))
        older = [m for exchange in exchanges[: len(exchanges) - keep] for m in exchange]
        if not older:
            return messages
        kept = [m for exchange in exchanges[len(exchanges) - keep :] for m in exchange]
        room = fits.budget - fits.tokens([*head]) - self.max_tokens - 64
        chars = int(room * fits.footprint.chars_per_token)
        if chars <= 0:  # the task alone leaves no room to ask: the next policy must fold
            return messages
        text = _transcript(older)[-chars:]
        ask = [*head, {"role": "user", "content": f"{self.request}\n\n{text}"}]
        summary = await ctx.chat(ask, max_tokens=self.max_tokens)
        note = {"role": "user", "content": f"Summary of the earlier steps: {summary.content or ''}"}
        return [*head, note, *kept]


def _transcript(messages: list[Message]) -> str:
    lines = []
    for message in messages:
        calls = [call.get("function", {}) for call in message.get("tool_calls") or ()]
        said = message.get("content") or ""
        text = said if isinstance(said, str) else json.dumps(said)
        called = "; ".join(f"{c.get('name')}({c.get('arguments')})" for c in calls)
        lines.append(f"{message['role']}: {' '.join(filter(None, [text, called]))}")
    return "\n".join(lines)


class ContextFolding:
    """Keeps an agent's conversation under ``budget`` prompt tokens (leave room in the model's
    context for the answer: budget + max_tokens at most the context). Before each call it
    estimates the conversation (``Footprint``) and, when over, applies ``policies`` in order
    until it fits. ``folds`` counts the folds made."""

    def __init__(
        self,
        budget: int,
        policies: Sequence[FoldPolicy] = (KeepLastTurns(),),
        *,
        margin: float = 0.1,
    ) -> None:
        if budget <= 0:
            raise ConfigError(f"budget must be a positive number of tokens, not {budget}")
        if not policies:
            raise ConfigError("ContextFolding needs at least one policy")
        self.budget, self.policies = budget, tuple(policies)
        self.footprint = Footprint()
        self._fits = FitCheck(self.footprint, int(budget * (1 - margin)))
        self.folds = 0

    async def fit(self, ctx: RolloutContext, messages: list[Message]) -> list[Message]:
        """``messages`` as the next call should send them: as they are while they fit, else
        folded (a new list)."""
        if self._fits(messages):
            return messages
        folded = messages
        for policy in self.policies:
            folded = await policy.fold(ctx, folded, self._fits)
            if self._fits(folded):
                break
        else:
            log.warning(
                "context folding left the conversation at about %d tokens, over its budget of "
                "%d: add a policy that folds further (KeepLastTurns)",
                self.footprint.estimate(folded),
                self.budget,
            )
        if folded == messages:  # nothing changed: no fold, no new segment
            return messages
        self.folds += 1
        return folded

    async def chat(
        self, ctx: RolloutContext, messages: list[Message], **sampling: Any
    ) -> ChatResult:
        """``ctx.chat`` on ``messages`` folded to the budget; ``messages`` is folded in place, so
        the agent goes on appending to its folded conversation."""
        folded = await self.fit(ctx, messages)
        if folded is not messages:
            messages[:] = folded
        reply = await ctx.chat(messages, **sampling)
        self.footprint.observe(copy.copy(messages), reply)
        return reply
