"""Chat turns behind a token engine: the prompt planned as token ids (extending the last turn
where the conversation does), sampled, decoded, tool calls parsed, and the turn recorded with
the exact ids and logprobs the engine gave."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from array import array
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from rollway.engines.base import Engine
from rollway.engines.whole_text import first_stop
from rollway.errors import InvalidFieldsError, RequestError, RolloutClosedError
from rollway.gateway.chat_answer import length_answer
from rollway.gateway.conversations import note_segment
from rollway.gateway.engine_calls import EngineCalls, Sampled
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.prompt_plan import PromptPlan, joined_ids, plan_prompt
from rollway.gateway.render.base import Renderer
from rollway.gateway.render.chat_template import ChatRenderer, TokenBudgetExceeded
from rollway.gateway.render.tool_calls import ParsedToolCalls
from rollway.gateway.render.turn_stream import (
    ContentDelta,
    ReasoningDelta,
    TurnPiece,
    TurnText,
    closing_pieces,
)
from rollway.gateway.request_schema import ChatCompletionRequest
from rollway.gateway.rollout_state import Conversation, RolloutState
from rollway.generation import ChatResult, GenerationResult, Message, SamplingParams
from rollway.trajectory import StepDistribution, Turn


@dataclass(frozen=True, slots=True)
class _PlannedTurn:
    """A turn ready for the engine: its prompt, sampling and request id, and the request's
    conversation, which it closes once answered."""

    plan: PromptPlan
    sampling: SamplingParams
    request_id: str
    use_tools: bool
    conversation: Conversation
    tools: list[dict[str, Any]] | None


class TokenTurns:
    """``context_length`` is the model's context: a prompt that leaves no room in it is
    refused (a ``RequestError``) and never reaches the engine."""

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        calls: EngineCalls,
        metrics: GatewayMetrics,
        context_length: int | None,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.calls = calls
        self.metrics = metrics
        self.context_length = context_length
        #: Ids past it name no token of this model (added tokens included).
        self.vocab_size = len(renderer.tokenizer)

    def check_stop_ids(self, ids: Sequence[int] | None) -> None:
        """Stop ids must name tokens of this model: another would never stop anything."""
        bad = next((i for i in ids or () if i >= self.vocab_size), None)
        if bad is not None:
            raise InvalidFieldsError(
                f"stop_token_ids: {bad} is past the model's vocabulary (ids 0 to "
                f"{self.vocab_size - 1})",
                param="stop_token_ids",
            )

    async def answer(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
    ) -> ChatResult:
        turn = await self._plan(state, request, conversation, tools)
        if isinstance(turn, ChatResult):
            return turn
        sampled = await self.calls.sample(
            self.engine, state, turn.request_id, turn.plan.ids().tolist(), turn.sampling
        )
        return self._finish(state, turn, sampled)

    async def answer_choices(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
        n: int,
    ) -> list[ChatResult]:
        """``n`` samples of one prompt, sampled together. The others are recorded first, each
        a branch (a new segment holding the whole prompt), and the first last, extending the
        conversation's segment: the next request extends it, as after ``answer``."""
        first = await self._plan(state, request, conversation, tools)
        if isinstance(first, ChatResult):
            return [first] * n
        # Each its own request id and sampling (a seed moves on per turn).
        planned = [first] + [
            _PlannedTurn(
                first.plan,
                self._sampling(state, request, first.plan),
                state.begin_turn(),
                first.use_tools,
                conversation,
                tools,
            )
            for _ in range(n - 1)
        ]
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(
                    self.calls.sample(
                        self.engine, state, t.request_id, t.plan.ids().tolist(), t.sampling
                    )
                )
                for t in planned
            ]
        branches = [
            self._finish(state, turn, task.result(), branch=True)
            for turn, task in zip(planned[1:], tasks[1:], strict=True)
        ]
        return [self._finish(state, first, tasks[0].result()), *branches]

    async def stream(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
    ) -> AsyncGenerator[TurnPiece, None]:
        """``answer`` as the tokens come: content deltas, then the rest of the answer and the
        ``ChatResult``, recorded from the collected chunks exactly as ``answer`` records."""
        turn = await self._plan(state, request, conversation, tools)
        if not isinstance(turn, ChatResult) and turn.plan.prefill is not None:
            # A continued message is parsed with its head, which a stream has not seen: its
            # answer comes whole at the end.
            at_once = await self.calls.sample(
                self.engine, state, turn.request_id, turn.plan.ids().tolist(), turn.sampling
            )
            turn = self._finish(state, turn, at_once)
        if isinstance(turn, ChatResult):
            for piece in closing_pieces(turn):
                yield piece
            return
        renderer = state.renderer or self.renderer
        text = TurnText(
            renderer, turn.sampling.stop, turn.use_tools, renderer.stop_ids, renderer.thinking
        )
        sampled = None
        chunks = self.calls.sample_stream(
            self.engine, state, turn.request_id, turn.plan.ids().tolist(), turn.sampling
        )
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if isinstance(chunk, Sampled):
                    sampled = chunk
                    continue
                delta = text.push(chunk.output_ids)
                if thought := text.take_reasoning():
                    yield ReasoningDelta(thought)
                if delta:
                    yield ContentDelta(delta)
        assert sampled is not None  # sample_stream ends with it or raises
        answer = self._finish(state, turn, sampled)
        for piece in closing_pieces(answer, text.sent, text.reasoning_sent):
            yield piece

    async def _plan(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
    ) -> _PlannedTurn | ChatResult:
        """The turn's prompt and sampling, or the answer made without the engine."""
        renderer = state.renderer or self.renderer
        try:
            budget = self._prompt_budget(state)
            plan = await plan_prompt(
                renderer, state, conversation, tools, budget, request.continue_final_message
            )
        except TokenBudgetExceeded as exc:
            return self._refuse_long_prompt(state, exc.at_least)
        sampling = self._sampling(state, request, plan)
        use_tools = bool(tools) and request.tool_choice != "none"
        return _PlannedTurn(plan, sampling, state.begin_turn(), use_tools, conversation, tools)

    @staticmethod
    def _sampling(
        state: RolloutState, request: ChatCompletionRequest, plan: PromptPlan
    ) -> SamplingParams:
        sampling = state.sampling_for(request.sampling_overrides())
        if state.max_seq_len is not None:
            room = state.max_seq_len - plan.prompt_len
            sampling = sampling.replace(max_tokens=min(sampling.max_tokens or room, room))
        return sampling

    def _finish(
        self, state: RolloutState, turn: _PlannedTurn, sampled: Sampled, branch: bool = False
    ) -> ChatResult:
        """Record the sampled turn and make its answer; a ``branch`` (another choice of the
        same prompt) starts its own segment and leaves the conversation as it is."""
        plan, result = turn.plan, sampled.result
        prompt_tokens = plan.prompt_len
        if (
            result.finish_reason == "length"
            and state.max_seq_len is not None
            and prompt_tokens + len(result.output_ids) >= state.max_seq_len
        ):
            self.truncate(state, "max_seq_len")
        renderer = state.renderer or self.renderer
        prefill = plan.prefill
        head = prefill.head if prefill else ""
        parsed, stop, specials = self._parse(
            renderer, result, turn.sampling, turn.use_tools, turn.tools, head
        )
        whole = parsed
        if prefill is not None and parsed.content.startswith(prefill.text):
            # The answer is the continuation (as Anthropic answers a prefill); the
            # conversation holds the message whole, as the caller will send it back.
            parsed = dataclasses.replace(parsed, content=parsed.content[len(prefill.text) :])
        recorded = self._record(state, plan, turn.sampling, sampled, parsed, specials, branch)
        note_segment(state, recorded, turn.conversation, turn.tools)
        message = _assistant_message(parsed)
        # The conversation as the thread it extends answered it (less a prefill), else as sent.
        conversation = plan.conversation
        if conversation is None:
            conversation = turn.conversation
            if prefill is not None:
                conversation = Conversation(conversation.messages[:-1], conversation.keys[:-1])
        if not branch:
            state.close_turn(conversation, _assistant_message(whole), turn.tools, recorded)
        if result.finish_reason == "abort":
            raise RolloutClosedError(
                f"rollout {state.rollout_id!r} was cancelled during generation"
            )
        finish = "tool_calls" if parsed.tool_calls else result.finish_reason
        self.metrics.turn_answered(finish)
        return ChatResult(
            message,
            finish,
            prompt_tokens,
            len(result.output_ids),
            completion_ids=result.output_ids,
            logprobs=result.logprobs,
            turn_index=recorded.index,
            stop_sequence=stop,
            top_ids=result.top_ids,
            top_logprobs=result.top_logprobs,
        )

    def truncate(self, state: RolloutState, reason: str) -> None:
        if state.mark_truncated(reason):
            self.metrics.truncated(state.rollout_id, reason)

    def _prompt_budget(self, state: RolloutState) -> int | None:
        """The most prompt tokens a turn may have: one under the tighter of the rollout's
        ``max_seq_len`` and the model's context, so that one token at least can be sampled."""
        limits = [n for n in (state.max_seq_len, self.context_length) if n is not None]
        return min(limits) - 1 if limits else None

    def _refuse_long_prompt(self, state: RolloutState, tokens: int) -> ChatResult:
        """Past its own ``max_seq_len`` a rollout is truncated (finish 'length', as designed);
        past the model's context the request is refused, as OpenAI's API does. ``tokens`` is
        exact, or a lower bound when the prompt's length alone ruled it out."""
        own = state.max_seq_len
        if own is not None and (self.context_length is None or own <= self.context_length):
            self.truncate(state, "max_seq_len")
            self.metrics.turn_answered("length")
            return length_answer(tokens)
        raise RequestError(
            f"the prompt needs at least {tokens} tokens; the model's context is "
            f"{self.context_length} tokens, one of which the answer needs",
            param="messages",
        )

    def _parse(
        self,
        renderer: Renderer,
        result: GenerationResult,
        sampling: SamplingParams,
        use_tools: bool,
        tools: list[dict[str, Any]] | None,
        head: str = "",
    ) -> tuple[ParsedToolCalls, str | None, list[int]]:
        """The answer's text, cut at the first stop string, that stop string (if any), and
        where the model sampled special tokens inside its answer: they are not text (a
        ``<|im_start|>`` mid-answer is the model opening a turn of its own), so the text leaves
        them out, as vLLM's ``skip_special_tokens`` does; the turn records where they were.
        ``head``: the text of a continued message's start, before the sampled text."""
        ids = result.output_ids
        special_ids = renderer.stop_ids  # the rollout's renderer's: GPT-OSS's are fewer
        end_id = None
        if ids and result.finish_reason == "stop" and ids[-1] in special_ids:
            end_id, ids = ids[-1], ids[:-1]
        specials = [at for at, token in enumerate(ids) if token in special_ids]
        if specials:
            ids = [token for token in ids if token not in special_ids]
        text = renderer.decode(ids)
        cut = first_stop(text, sampling.stop)
        stop = None
        if cut is not None:
            at, stop = cut
            text, end_id = text[:at], None  # a stop string ended it, not the token
        return renderer.parse(head + text, use_tools, tools, end_id), stop, specials

    @staticmethod
    def _record(
        state: RolloutState,
        plan: PromptPlan,
        sampling: SamplingParams,
        sampled: Sampled,
        parsed: ParsedToolCalls,
        specials: list[int],
        branch: bool = False,
    ) -> Turn:
        segment = plan.segment
        extends = segment is not None
        # A concurrent call may have extended the same parent first: then this is a branch.
        last = None if segment is None else state.last_in_segment(segment)
        if branch or last is None or last.index != plan.parent:
            segment, extends = state.next_segment(), False
        result = sampled.result
        hashes = state.sequence_hashes
        # The head alone, where the parent's hash state is no longer kept (an older thread's).
        head = functools.partial(joined_ids, plan.head)
        digest, hashed = hashes.prompt_hash(plan.parent, plan.start, plan.tail, head)
        # Each id is held once, by the turn that added it: a turn that starts a segment keeps
        # its whole prompt (its head, if it had one, stays with the turns that hold it).
        new_prompt = plan.tail if extends or not plan.head else plan.ids()
        # Held in flight as arrays (``Turn.as_recorded``); float64 logprobs: what is recorded.
        completion, logprobs = array("i", result.output_ids), array("d", result.logprobs)
        # Built from values the gateway made itself: validating them again would cost more
        # than the rest of the record (the prompt ids alone are thousands of ints).
        turn = Turn.model_construct(
            index=len(state.turns),
            segment=segment,
            request_id=sampled.request_id,
            prompt_len=plan.prompt_len,
            new_prompt_ids=new_prompt,
            completion_ids=completion,
            logprobs=logprobs,
            finish_reason=result.finish_reason,
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            tool_call_parse_error=parsed.error,
            sampling=state.recorded_sampling(sampling),
            latency_ms=sampled.latency * 1000.0,
            prompt_hash=digest,
            policy_versions=result.policy_versions,
            logprob_kind=result.logprob_kind,
            raw_logprobs=result.raw_logprobs,
            kept_mass=result.kept_mass,
            distribution=StepDistribution.of(result),
            reissued=sampled.reissued,
            special_tokens_at=specials,
        )
        state.turns.append(turn)
        hashes.remember(turn.index, hashed, plan.prompt_len, completion)
        return turn


def _assistant_message(parsed: ParsedToolCalls) -> Message:
    message: Message = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        # vLLM's and SGLang's field; the sample keeps the thinking tokens as sampled.
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = parsed.tool_calls
    return message
