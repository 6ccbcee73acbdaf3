"""The gateway core: register, chat, trajectory, cancel, unregister. No HTTP in here.

In-process agents call this object directly; ``rollway.gateway.app`` is a thin HTTP layer over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from rollway.engines.base import ChatEngine, Engine
from rollway.errors import (
    AuthError,
    EngineError,
    InvalidFieldsError,
    RequestError,
    RolloutClosedError,
    UnknownRolloutError,
)
from rollway.gateway.chat_template import ChatRenderer, Message, TokenBudgetExceeded
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.passthrough import chat_passthrough
from rollway.gateway.prompt_plan import PromptPlan, plan_prompt
from rollway.gateway.protocol import ChatCompletionRequest, RegisterRequest, parse_model
from rollway.gateway.rollout import (
    RolloutState,
    build_trajectory,
    message_key,
    prompt_hash,
)
from rollway.gateway.tool_calls import ParsedCompletion, parse_tool_calls
from rollway.gateway.weights import WeightControl
from rollway.ids import check_id, keys_match
from rollway.types import GenerationResult, SamplingParams, Trajectory, Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Registration:
    rollout_id: str
    api_key: str


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One answered chat call: the assistant message and what the HTTP layer reports."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    completion_ids: list[int]
    logprobs: list[float]
    turn_index: int | None


class Gateway:
    """Records every model call of every registered rollout, token-exactly.

    ``context_length`` is the model's context: a prompt that leaves no room in it is refused
    (a ``RequestError``) and never reaches the engine. A rollout unused for ``rollout_ttl_s``
    seconds (no chat call, fetch, cancel) is dropped by ``expire_idle`` (None: never).

    ``weights`` pauses, updates and resumes the engine for a training loop. A turn the engine
    aborted while its rollout was not cancelled (a pause in ``abort`` mode) is sent again,
    under a new request id, up to ``max_reissues`` times: the agent sees a slower turn.
    """

    def __init__(
        self,
        engine: Engine | ChatEngine,
        renderer: ChatRenderer,
        *,
        model_name: str,
        context_length: int | None = None,
        rollout_ttl_s: float | None = 3600.0,
        max_reissues: int = 16,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.model_name = model_name
        self.context_length = context_length
        self.rollout_ttl_s = rollout_ttl_s
        self.max_reissues = max_reissues
        self.metrics = GatewayMetrics()
        self.weights = WeightControl(engine)
        self._rollouts: dict[str, RolloutState] = {}
        self._special_ids = frozenset(renderer.tokenizer.all_special_ids)
        self._decoy_key = _new_key()

    def register(
        self,
        rollout_id: str,
        request: RegisterRequest | dict[str, Any],
        *,
        reuse: bool = False,
    ) -> Registration:
        """Open a rollout and return its key. An id already open is an error, unless ``reuse``:
        then its existing key comes back (a restarted client re-attaching to its rollout)."""
        if isinstance(request, dict):
            request = parse_model(RegisterRequest, request)
        check_id(rollout_id, "rollout_id")
        if rollout_id in self._rollouts:
            if reuse:
                return Registration(rollout_id, self._rollouts[rollout_id].api_key)
            raise RolloutClosedError(f"rollout {rollout_id!r} is already registered")
        state = RolloutState(
            rollout_id=rollout_id,
            api_key=_new_key(),
            model=request.model or self.model_name,
            sampling=request.sampling(),
            locked_sampling=request.sampling_overrides(),
            max_turns=request.max_turns,
            max_seq_len=request.max_seq_len,
            metadata=request.metadata,
            has_token_ids=not isinstance(self.engine, ChatEngine),
        )
        self._rollouts[rollout_id] = state
        self.metrics.rollouts_active.inc()
        return Registration(rollout_id, state.api_key)

    def authorize(self, rollout_id: str, api_key: str | None) -> None:
        """The key is checked before the rollout is looked up, and an unknown rollout costs
        the same comparison: a caller without the key cannot tell which ids exist."""
        state = self._rollouts.get(rollout_id)
        expected = state.api_key if state is not None else self._decoy_key
        if not keys_match(api_key, expected) or state is None:
            raise AuthError(f"wrong or missing key for rollout {rollout_id!r}")

    async def chat(
        self, rollout_id: str, request: ChatCompletionRequest | dict[str, Any]
    ) -> ChatResult:
        state = self._get(rollout_id)
        if isinstance(request, dict):
            request = parse_model(ChatCompletionRequest, request)
        if state.cancelled:
            state.cut_by_cancel = True
            raise RolloutClosedError(f"rollout {rollout_id!r} was cancelled")
        state.busy += 1  # a busy rollout never expires
        try:
            return await self._chat(state, request)
        finally:
            state.busy -= 1
            state.last_active = time.monotonic()

    async def _chat(self, state: RolloutState, request: ChatCompletionRequest) -> ChatResult:
        messages, tools = request.message_dicts(), request.tool_dicts()
        keys = [message_key(m) for m in messages]
        if state.max_turns is not None and state.turns_started >= state.max_turns:
            return self._truncate(state, "max_turns")
        if isinstance(self.engine, ChatEngine):
            return await chat_passthrough(self, state, request, messages, keys)
        try:
            budget = self._prompt_budget(state)
            plan = await plan_prompt(self.renderer, state, messages, keys, tools, budget)
        except TokenBudgetExceeded as exc:
            return self._refuse_long_prompt(state, exc.at_least)
        sampling = self.effective_sampling(state, request)
        if state.max_seq_len is not None:
            room = state.max_seq_len - len(plan.prompt_ids)
            sampling = sampling.replace(max_tokens=min(sampling.max_tokens or room, room))
        state.turns_started += 1
        rollout_id = state.rollout_id
        request_id = f"{rollout_id}-{state.turns_started}"
        result, latency, request_id, reissued = await self._sample(
            state, request_id, plan.prompt_ids, sampling
        )
        if (
            result.finish_reason == "length"
            and state.max_seq_len is not None
            and len(plan.prompt_ids) + len(result.output_ids) >= state.max_seq_len
        ):
            self._mark_truncated(state, "max_seq_len")
        use_tools = bool(tools) and request.tool_choice != "none"
        parsed = self._parse(result, sampling, use_tools)
        turn = self._record(state, request_id, plan, sampling, result, parsed, latency, reissued)
        message = _assistant_message(parsed)
        state.messages = [*messages, message]
        state.message_keys = [*keys, message_key(message)]
        state.tools = tools
        if result.finish_reason == "abort":
            raise RolloutClosedError(f"rollout {rollout_id!r} was cancelled during generation")
        finish = "tool_calls" if parsed.tool_calls else result.finish_reason
        self.metrics.turns.labels(finish).inc()
        return ChatResult(
            message,
            finish,
            len(plan.prompt_ids),
            len(result.output_ids),
            result.output_ids,
            result.logprobs,
            turn.index,
        )

    def remember_response(self, rollout_id: str, response_id: str) -> None:
        """Name the rollout's current conversation, for ``previous_response_id``."""
        state = self._get(rollout_id)
        state.responses[response_id] = list(state.messages)

    def response_history(self, rollout_id: str, response_id: str | None) -> list[Message]:
        """The conversation a Responses API call continues (empty when it names none)."""
        if response_id is None:
            return []
        history = self._get(rollout_id).responses.get(response_id)
        if history is None:
            raise InvalidFieldsError(
                f"unknown previous_response_id {response_id!r}", param="previous_response_id"
            )
        return history

    async def trajectory(self, rollout_id: str) -> Trajectory:
        """The rollout's record, built in a worker thread from a snapshot: the drift figure
        re-renders and tokenizes the whole conversation, which grows with the rollout."""
        state = self._get(rollout_id)
        return await asyncio.to_thread(build_trajectory, state.snapshot(), self.renderer)

    async def cancel(self, rollout_id: str) -> None:
        state = self._get(rollout_id)
        state.cancelled = True
        state.cut_by_cancel |= bool(state.in_flight)
        for request_id in list(state.in_flight):
            await self.engine.abort(request_id)

    async def unregister(self, rollout_id: str) -> None:
        await self.cancel(rollout_id)
        del self._rollouts[rollout_id]
        self.metrics.rollouts_active.dec()

    def expire_idle(self) -> list[str]:
        """Drop (as cancelled) every rollout unused for longer than the TTL, except those with
        a chat call running: a client that died leaves its rollouts behind. Their ids back."""
        if self.rollout_ttl_s is None:
            return []
        now = time.monotonic()
        expired = [
            rollout_id
            for rollout_id, state in self._rollouts.items()
            if not state.busy and not state.in_flight
            and now - state.last_active > self.rollout_ttl_s
        ]  # fmt: skip
        for rollout_id in expired:
            self._rollouts.pop(rollout_id).cancelled = True
            self.metrics.rollouts_active.dec()
            self.metrics.rollouts_expired.inc()
            log.info("rollout expired", extra={"rollout_id": rollout_id, "stage": "expire"})
        return expired

    async def expire_idle_forever(self) -> None:
        """Run ``expire_idle`` a few times per TTL until cancelled (a served app's lifespan
        owns this task); returns at once when rollouts never expire."""
        if self.rollout_ttl_s is None:
            return
        interval = min(max(self.rollout_ttl_s / 4, 0.01), 30.0)
        while True:
            await asyncio.sleep(interval)
            self.expire_idle()

    def _get(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise UnknownRolloutError(f"no rollout {rollout_id!r} is registered")
        state.last_active = time.monotonic()
        return state

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
            return self._truncate(state, "max_seq_len", tokens)
        raise RequestError(
            f"the prompt needs at least {tokens} tokens; the model's context is "
            f"{self.context_length} tokens, one of which the answer needs",
            param="messages",
        )

    @staticmethod
    def effective_sampling(state: RolloutState, request: ChatCompletionRequest) -> SamplingParams:
        """Registered sampling params win; the request fills only what registration left open.
        A seed moves on by one per turn, so turns of a seeded rollout do not repeat draws."""
        asked = request.sampling_overrides()
        merged = {**asked, **state.locked_sampling}
        if "max_tokens" in asked and "max_tokens" in state.locked_sampling:
            merged["max_tokens"] = min(asked["max_tokens"], state.locked_sampling["max_tokens"])
        if merged.get("seed") is not None:
            merged["seed"] += state.turns_started
        return SamplingParams(**merged)

    @contextlib.asynccontextmanager
    async def engine_call(self, state: RolloutState, request_id: str) -> AsyncIterator[None]:
        """Track a request as in flight (so cancel can abort it) and turn unexpected engine
        failures into ``EngineError``; the caller's bad input stays a ``RequestError``."""
        state.in_flight.add(request_id)
        try:
            yield
        except RequestError:
            raise
        except EngineError as exc:
            self._engine_failed(state, exc)
            raise
        except Exception as exc:
            error = EngineError(f"engine failed: {exc!r}")
            self._engine_failed(state, error)
            raise error from exc
        finally:
            state.in_flight.discard(request_id)

    def _engine_failed(self, state: RolloutState, error: EngineError) -> None:
        self.metrics.engine_errors.inc()
        state.engine_errors = [*state.engine_errors[-4:], str(error)]

    async def _sample(
        self, state: RolloutState, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> tuple[GenerationResult, float, str, int]:
        """One turn's generation: the result, the time it took (re-issues included), the id
        of the request whose tokens count, and how many times the engine aborted it first."""
        sent_as, spent = request_id, 0.0
        for reissued in range(self.max_reissues + 1):
            result, latency = await self._generate(state, sent_as, prompt_ids, sampling)
            spent += latency
            versions = result.policy_versions
            if versions is not None and len(versions) != len(result.output_ids):
                error = EngineError(f"the engine gave {len(versions)} policy versions for "
                                    f"{len(result.output_ids)} tokens")  # fmt: skip
                self._engine_failed(state, error)
                raise error
            if result.finish_reason != "abort" or state.cancelled:
                return result, spent, sent_as, reissued
            # Not our cancel: the engine dropped it (a weight update). It runs again once the
            # engine resumes; a new id, because an engine may still hold the old one.
            self.metrics.turns_reissued.inc()
            sent_as = f"{request_id}.{reissued + 1}"
        error = EngineError(
            f"the engine aborted turn {request_id} {self.max_reissues + 1} times; "
            "is something pausing it in abort mode over and over?"
        )
        self._engine_failed(state, error)
        raise error

    async def _generate(
        self, state: RolloutState, request_id: str, prompt_ids: list[int], sampling: SamplingParams
    ) -> tuple[GenerationResult, float]:
        started = time.perf_counter()
        async with self.engine_call(state, request_id):
            result = await self.engine.generate(prompt_ids, sampling, request_id)  # type: ignore[union-attr]
        latency = time.perf_counter() - started
        self.metrics.turn_latency.observe(latency)
        self.metrics.tokens.labels("prompt").inc(len(prompt_ids))
        self.metrics.tokens.labels("completion").inc(len(result.output_ids))
        return result, latency

    def _parse(
        self, result: GenerationResult, sampling: SamplingParams, use_tools: bool
    ) -> ParsedCompletion:
        ids = result.output_ids
        if ids and result.finish_reason == "stop" and ids[-1] in self._special_ids:
            ids = ids[:-1]
        text = self.renderer.decode(ids)
        cuts = [i for i in (text.find(s) for s in sampling.stop) if i >= 0]
        if cuts:
            text = text[: min(cuts)]
        return parse_tool_calls(text) if use_tools else ParsedCompletion(text)

    def _record(
        self,
        state: RolloutState,
        request_id: str,
        plan: PromptPlan,
        sampling: SamplingParams,
        result: GenerationResult,
        parsed: ParsedCompletion,
        latency: float,
        reissued: int = 0,
    ) -> Turn:
        segment = plan.segment
        # A concurrent call may have extended the same parent first: then this is a branch.
        if segment is None or state.last_in_segment(segment).index != plan.parent:
            segment = state.next_segment()
        turn = Turn(
            index=len(state.turns),
            segment=segment,
            request_id=request_id,
            prompt_ids=plan.prompt_ids,
            completion_ids=result.output_ids,
            logprobs=result.logprobs,
            finish_reason=result.finish_reason,
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            tool_call_parse_error=parsed.error,
            sampling=sampling.to_dict(),
            latency_ms=latency * 1000.0,
            prompt_hash=prompt_hash(plan.prompt_ids),
            policy_versions=result.policy_versions,
            logprob_kind=result.logprob_kind,
            reissued=reissued,
        )
        state.turns.append(turn)
        return turn

    def _truncate(self, state: RolloutState, reason: str, prompt_tokens: int = 0) -> ChatResult:
        """Answer a call past a limit without the engine: empty content, finish 'length'."""
        self._mark_truncated(state, reason)
        self.metrics.turns.labels("length").inc()
        message: Message = {"role": "assistant", "content": ""}
        return ChatResult(message, "length", prompt_tokens, 0, [], [], None)

    def _mark_truncated(self, state: RolloutState, reason: str) -> None:
        if state.truncation_reason is None:
            state.truncation_reason = reason
            self.metrics.truncations.labels(reason).inc()
            log.info("rollout truncated", extra={"rollout_id": state.rollout_id, "stage": reason})


def _assistant_message(parsed: ParsedCompletion) -> Message:
    if parsed.tool_calls:
        return {
            "role": "assistant",
            "content": parsed.content or None,
            "tool_calls": parsed.tool_calls,
        }
    return {"role": "assistant", "content": parsed.content}


def _new_key() -> str:
    return f"rk-{secrets.token_urlsafe(24)}"
