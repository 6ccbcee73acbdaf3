"""The gateway core: register, chat, trajectory, cancel, unregister. No HTTP in here.

In-process agents call this object directly; ``gateway.http.gateway_app`` is a thin HTTP
layer over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from rollway import tracing
from rollway.engines.base import ChatEngine, Engine
from rollway.errors import (
    AuthError,
    InvalidFieldsError,
    RolloutClosedError,
    UnknownRolloutError,
)
from rollway.events import EventBus, RolloutStuck, TurnFinished, TurnStarted
from rollway.gateway.chat_answer import Registration, length_answer
from rollway.gateway.chat_turns import ChatTurns
from rollway.gateway.conversations import note_conversation
from rollway.gateway.engine_calls import EngineCalls
from rollway.gateway.experiment_leases import ExperimentLeases
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.renderers import load_renderer
from rollway.gateway.render.turn_stream import TurnPiece, closing_pieces
from rollway.gateway.request_messages import ChatCompletionAsSent, read_conversation
from rollway.gateway.request_schema import ChatCompletionRequest, RegisterRequest
from rollway.gateway.rollout_state import RolloutState
from rollway.gateway.token_turns import TokenTurns
from rollway.gateway.trajectory_build import build_trajectory
from rollway.gateway.weight_control import WeightControl
from rollway.generation import ChatResult, Message
from rollway.ids import check_id, keys_match
from rollway.trajectory import Trajectory
from rollway.validation import parse_model

log = logging.getLogger(__name__)


class Gateway:
    """Records every model call of every registered rollout, token-exactly.

    ``context_length`` is the model's context: a prompt that leaves no room in it is refused
    (a ``RequestError``) and never reaches the engine. A rollout unused for ``rollout_ttl_s``
    seconds (no chat call, fetch, cancel) is dropped by ``expire_idle`` (None: never).

    ``events`` is an ``EventBus``: whoever subscribes hears each chat call start and finish
    (``TurnStarted``, ``TurnFinished``); nobody listening costs one check per call.

    ``weights`` pauses, updates and resumes the engine for a training loop. A turn the engine
    aborted while its rollout was not cancelled (a pause in ``abort`` mode) is sent again,
    under a new request id, up to ``max_reissues`` times: the agent sees a slower turn. Once
    sent again ``protect_after_reissues`` times, it is protected: the gateway's next abort-mode
    pause lets it finish first, so updates faster than a turn never starve it.
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
        protect_after_reissues: int = 2,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.model_name = model_name
        self.context_length = context_length
        self.rollout_ttl_s = rollout_ttl_s
        self.max_reissues = max_reissues
        self.metrics = GatewayMetrics()
        self.events = EventBus()
        self.weights = WeightControl(engine, protect_after_reissues)
        calls = EngineCalls(self.metrics, max_reissues, self.weights.protected)
        self._turns: TokenTurns | ChatTurns = (
            ChatTurns(engine, calls, self.metrics)
            if isinstance(engine, ChatEngine)
            else TokenTurns(engine, renderer, calls, self.metrics, context_length)
        )
        #: Renderers by name, made on a rollout's first asking (registration's ``renderer``).
        self._renderers: dict[str, ChatRenderer] = {renderer.name: renderer}
        self._rollouts: dict[str, RolloutState] = {}
        #: Each open rollout's key -> its id: a call on the gateway's shared routes (one base
        #: URL for every rollout) finds its rollout by the key it carries.
        self._by_key: dict[str, str] = {}
        self._decoy_key = _new_key()
        #: Which client holds each experiment here (clients sharing this gateway).
        self.leases = ExperimentLeases()

    def register(
        self,
        rollout_id: str,
        request: RegisterRequest | dict[str, Any],
        *,
        reuse: bool = False,
        client: str | None = None,
    ) -> Registration:
        """Open a rollout and return its key. An id already open is an error, unless ``reuse``:
        then its existing key comes back (a restarted client re-attaching to its rollout).
        A rollout of an experiment that a client holds here (``leases``) opens only for that
        client (``client``: its lease holder id)."""
        if isinstance(request, dict):
            request = parse_model(RegisterRequest, request, strict=False)
        check_id(rollout_id, "rollout_id")
        self._check_stop_ids(request.stop_token_ids)
        renderer = None if request.renderer is None else self.renderer_named(request.renderer)
        self.leases.check_register(rollout_id, client)
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
            history=request.history,
            renderer=renderer,
            metadata=request.metadata,
            max_conversations=request.max_conversations,
            side_calls=request.side_calls,
            has_token_ids=not isinstance(self.engine, ChatEngine),
            trace_parent=tracing.current_context(),
        )
        self._rollouts[rollout_id] = state
        self._by_key[state.api_key] = rollout_id
        self.metrics.rollouts_active.inc()
        return Registration(rollout_id, state.api_key)

    def renderer_named(self, name: str) -> ChatRenderer:
        """The renderer ``name`` over this gateway's tokenizer, made once."""
        renderer = self._renderers.get(name)
        if renderer is None:
            renderer = load_renderer(self.renderer.tokenizer, name)
            self._renderers[name] = renderer
        return renderer

    def authorize(self, rollout_id: str, api_key: str | None) -> None:
        """The key is checked before the rollout is looked up, and an unknown rollout costs
        the same comparison: a caller without the key cannot tell which ids exist."""
        state = self._rollouts.get(rollout_id)
        expected = state.api_key if state is not None else self._decoy_key
        if not keys_match(api_key, expected) or state is None:
            raise AuthError(f"wrong or missing key for rollout {rollout_id!r}")

    def rollout_of_key(self, api_key: str | None) -> str | None:
        """The open rollout whose key is ``api_key`` (None: no such rollout). The key is a
        random secret of 32 characters, so finding it by hashing tells a caller nothing."""
        return self._by_key.get(api_key) if api_key else None

    def is_open(self, rollout_id: str) -> bool:
        return rollout_id in self._rollouts

    async def chat(
        self, rollout_id: str, request: ChatCompletionRequest | dict[str, Any]
    ) -> ChatResult:
        """One answer; a request for ``n`` > 1 choices goes to ``chat_choices``."""
        state, request = self._open_turn(rollout_id, request)
        if request.n > 1:
            raise InvalidFieldsError(
                "n: more than one choice is answered by Gateway.chat_choices", param="n"
            )
        return (await self._answered(state, request))[0]

    async def chat_choices(
        self, rollout_id: str, request: ChatCompletionRequest | dict[str, Any]
    ) -> list[ChatResult]:
        """``request.n`` samples of one prompt, in choice order: the first continues the
        rollout's conversation (the next request extends it); each other is recorded as its
        own branch (a turn that starts a segment: one exact sample of its own)."""
        state, request = self._open_turn(rollout_id, request)
        return await self._answered(state, request)

    async def _answered(
        self, state: RolloutState, request: ChatCompletionRequest
    ) -> list[ChatResult]:
        attributes = _turn_attributes(state.rollout_id, state.turns_started)
        with (
            self._busy(state) as answered,
            tracing.span("rollway.gateway.turn", attributes, parent=state.trace_parent) as span,
        ):
            choices = await self._chat(state, request)
            answered.append(choices[0])
            span.set(_turn_outcome(choices[0]))
            return choices

    async def chat_stream(
        self, rollout_id: str, request: ChatCompletionRequest | dict[str, Any]
    ) -> AsyncGenerator[TurnPiece, None]:
        """``chat`` as the engine samples: ``ContentDelta``s as its text comes, each tool call
        (a ``ToolCallDelta``) once the answer is parsed, and last the ``ChatResult``, the same
        answer and the same recorded turn as ``chat``. Closing it early aborts the generation.
        Behind a chat-level engine or past a limit, the whole answer comes in pieces at once."""
        state, request = self._open_turn(rollout_id, request)
        attributes = _turn_attributes(rollout_id, state.turns_started) | {"rollway.stream": True}
        with (
            self._busy(state) as answered,
            tracing.detached_span(
                "rollway.gateway.turn", attributes, parent=state.trace_parent
            ) as span,
        ):
            if isinstance(self._turns, TokenTurns) and not self._past_max_turns(state):
                conversation = read_conversation(state, request)
                note_conversation(state, conversation)
                pieces = self._turns.stream(state, request, conversation, request.tool_dicts())
                async with contextlib.aclosing(pieces):
                    async for piece in pieces:
                        if isinstance(piece, ChatResult):
                            answered.append(piece)
                            state.record_fields([piece], request.recorded_fields())
                        yield piece
            else:
                answered.append((await self._chat(state, request))[0])
                for piece in closing_pieces(answered[0]):
                    yield piece
            if answered:
                span.set(_turn_outcome(answered[0]))

    def _open_turn(
        self, rollout_id: str, request: ChatCompletionRequest | dict[str, Any]
    ) -> tuple[RolloutState, ChatCompletionRequest]:
        state = self._get(rollout_id)
        if isinstance(request, dict):
            request = ChatCompletionAsSent.from_caller(request)
        self._check_stop_ids(request.stop_token_ids)
        if state.cancelled:
            state.cut_by_cancel = True
            raise RolloutClosedError(f"rollout {rollout_id!r} was cancelled")
        return state, request

    def _check_stop_ids(self, ids: list[int] | None) -> None:
        """Within the model's vocabulary, where the gateway knows it (a token engine's)."""
        if isinstance(self._turns, TokenTurns):
            self._turns.check_stop_ids(ids)

    @contextlib.contextmanager
    def _busy(self, state: RolloutState) -> Iterator[list[ChatResult]]:
        """A chat call running: the rollout cannot expire, and listeners hear it start and
        finish (with the answer the caller puts in the list, or as an error)."""
        state.busy += 1
        turn, started, answered = state.turns_started, time.perf_counter(), list[ChatResult]()
        if self.events:
            self.events(TurnStarted(rollout_id=state.rollout_id, turn=turn))
        try:
            yield answered
        finally:
            state.busy -= 1
            state.last_active = time.monotonic()
            if self.events:
                latency = time.perf_counter() - started
                result = answered[0] if answered else None
                self.events(_turn_finished(state.rollout_id, turn, result, latency))

    def _past_max_turns(self, state: RolloutState) -> bool:
        return state.max_turns is not None and state.turns_started >= state.max_turns

    async def _chat(self, state: RolloutState, request: ChatCompletionRequest) -> list[ChatResult]:
        """The request's choices (one unless it asks ``n``), its recorded fields noted."""
        conversation = read_conversation(state, request)
        note_conversation(state, conversation)
        if self._past_max_turns(state):
            if state.mark_truncated("max_turns"):
                self.metrics.truncated(state.rollout_id, "max_turns")
            self.metrics.turn_answered("length")
            return [length_answer()] * request.n
        tools = request.tool_dicts()
        if request.n > 1:
            choices = await self._turns.answer_choices(
                state, request, conversation, tools, request.n
            )
        else:
            choices = [await self._turns.answer(state, request, conversation, tools)]
        state.record_fields(choices, request.recorded_fields())
        return choices

    async def count_tokens(self, rollout_id: str, request: ChatCompletionRequest) -> int:
        """The prompt's length in tokens as the rollout's renderer makes it (no turn)."""
        state = self._get(rollout_id)
        renderer = state.renderer or self.renderer
        messages = request.message_dicts()
        ids = await asyncio.to_thread(renderer.prompt_ids, messages, request.tool_dicts())
        return len(ids)

    def note_refusal(self, rollout_id: str, status: int, body: dict[str, Any]) -> None:
        """A 4xx the gateway gave a rollout's agent: logged, and counted on its record (the
        first body kept) where the rollout is open."""
        error = body.get("error") or {}
        log.warning(
            "refused a request of rollout %s (%d): %s",
            rollout_id,
            status,
            error.get("message"),
            extra={"rollout_id": rollout_id, "stage": "refusal"},
        )
        state = self._rollouts.get(rollout_id)
        if state is not None:
            state.note_refusal(status, body)

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
        snapshot = self._get(rollout_id).snapshot()
        renderer = snapshot.renderer or self.renderer
        return await asyncio.to_thread(build_trajectory, snapshot, renderer)

    async def cancel(self, rollout_id: str) -> None:
        state = self._get(rollout_id)
        state.cancelled = True
        state.cut_by_cancel |= bool(state.in_flight)
        for request_id in list(state.in_flight):
            await self.engine.abort(request_id)

    async def unregister(self, rollout_id: str) -> None:
        await self.cancel(rollout_id)
        self._drop(rollout_id)
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
            if not state.busy
            and not state.in_flight
            and now - state.last_active > self.rollout_ttl_s
        ]
        for rollout_id in expired:
            self._drop(rollout_id).cancelled = True
            self.metrics.rollouts_active.dec()
            self.metrics.rollouts_expired.inc()
            log.info("rollout expired", extra={"rollout_id": rollout_id, "stage": "expire"})
        return expired

    def stuck(self, after_s: float) -> list[RolloutStuck]:
        """Every open rollout without progress for ``after_s`` seconds, and where it waits:
        on the engine (its oldest pending request), at the gateway (a chat call not yet sent
        to the engine), or in its agent (no model call pending). Sets the stuck gauge."""
        now, found = time.monotonic(), []
        for state in self._rollouts.values():
            if state.cancelled:
                continue
            waiting = _waiting(state, now)
            if waiting.idle_s >= after_s:
                found.append(waiting)
        self.metrics.rollouts_stuck.set(len(found))
        return found

    def waiting(self, rollout_id: str) -> RolloutStuck | None:
        """Where an open rollout waits now and since when, as ``stuck`` says, without counting
        as a use of it; None when it is not open. What a timeout's record says."""
        state = self._rollouts.get(rollout_id)
        return None if state is None else _waiting(state, time.monotonic())

    def requests_in_flight(self) -> int:
        """Engine requests of every rollout running now (queued in the engine included)."""
        return sum(len(state.in_flight) for state in self._rollouts.values())

    async def expire_idle_forever(self) -> None:
        """Run ``expire_idle`` a few times per TTL until cancelled (a served app's lifespan
        owns this task); returns at once when rollouts never expire."""
        if self.rollout_ttl_s is None:
            return
        interval = min(max(self.rollout_ttl_s / 4, 0.01), 30.0)
        while True:
            await asyncio.sleep(interval)
            self.expire_idle()

    def _drop(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.pop(rollout_id)
        self._by_key.pop(state.api_key, None)
        return state

    def _get(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise UnknownRolloutError(f"no rollout {rollout_id!r} is registered")
        state.last_active = time.monotonic()
        return state


def _turn_finished(
    rollout_id: str, turn: int, result: ChatResult | None, latency_s: float
) -> TurnFinished:
    if result is None:  # it raised
        return TurnFinished(
            rollout_id=rollout_id,
            turn=turn,
            prompt_tokens=0,
            completion_tokens=0,
            latency_s=latency_s,
            finish_reason="error",
        )
    return TurnFinished(
        rollout_id=rollout_id,
        turn=turn,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        latency_s=latency_s,
        finish_reason=result.finish_reason,
    )


def _turn_attributes(rollout_id: str, turn: int) -> dict[str, Any]:
    return {"rollway.rollout_id": rollout_id, "rollway.turn": turn}


def _turn_outcome(result: ChatResult) -> dict[str, Any]:
    """The answer's attributes; token counts under OpenTelemetry's GenAI names."""
    return {
        "rollway.turn_index": result.turn_index,
        "rollway.finish_reason": result.finish_reason,
        "gen_ai.usage.input_tokens": result.prompt_tokens,
        "gen_ai.usage.output_tokens": result.completion_tokens,
    }


def _new_key() -> str:
    return f"rk-{secrets.token_urlsafe(24)}"


def _waiting(state: RolloutState, now: float) -> RolloutStuck:
    """Where a rollout waits: on the engine (its oldest pending request), at the gateway (a
    chat call not yet sent to the engine), or in its agent (no model call pending)."""
    if state.in_flight:
        request_id, sent = min(state.in_flight.items(), key=lambda item: item[1])
        return RolloutStuck(
            rollout_id=state.rollout_id,
            waiting_in="engine",
            request_id=request_id,
            idle_s=now - sent,
        )
    return RolloutStuck(
        rollout_id=state.rollout_id,
        waiting_in="gateway" if state.busy else "agent",
        request_id=None,
        idle_s=now - state.last_active,
    )
