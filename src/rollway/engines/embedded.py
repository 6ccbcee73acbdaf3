"""The embedded engine: a real small model run in-process with PyTorch + transformers.

Requests queue for one worker thread. Requests that arrive while a batch decodes join the next
batch. A batch computes its prompts' shared prefix once, left-pads the rest with explicit
position ids and decodes step by step with a KV cache, every row sampling under its own params
and generator. A row whose sampling fails (NaN logits) fails its own request only; the batch
decodes on. Logprobs are the log-softmax of
the fp32 logits at temperature 1 for each sampled token, whatever the sampling temperature.

Weights are replaced in place (``WeightSync``): ``pause`` stops the worker from starting a
batch (``abort`` ends the running rows at the next step, ``drain`` lets them finish, ``keep``
freezes them between two decode steps with their KV cache, as SGLang's in-place pause does);
the new tensors are copied into the existing parameters only while no forward pass runs, and
each sampled token carries the version of the weights whose forward pass produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollway.engines.base import PauseMode, WeightSource
from rollway.engines.models import resolve_model_path
from rollway.engines.sampling import check_sampling, choose_token, make_generator
from rollway.engines.state_dicts import check_state_dict, copy_weights, read_state_dict
from rollway.errors import ConfigError, EngineError, InvalidFieldsError
from rollway.types import FinishReason, GenerationResult, SamplingParams

#: Shorter shared prefixes are not worth a separate forward pass.
_MIN_SHARED_PREFIX = 16


@dataclass(eq=False)
class _Request:
    request_id: str
    input_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenerationResult]
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: The weights version that sampled each output id.
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    #: Set by ``abort`` (or ``pause("abort")``); the worker ends the row at its next step.
    abort_requested: bool = False
    #: Answered (its future is settled or about to be); the worker answers each row once.
    settled: bool = False
    #: Set when this row alone failed; its batch goes on without it.
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def finish(self, reason: FinishReason) -> None:
        self.finish_reason = reason

    def resolve(self, batch_error: BaseException | None = None) -> None:
        error = batch_error or self.error

        def settle() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                result = GenerationResult(
                    self.output_ids,
                    self.logprobs,
                    self.finish_reason,
                    policy_versions=self.versions,
                    logprob_kind="raw_logprobs",
                )
                self.future.set_result(result)

        # A closed loop means the caller is gone; the worker thread must live on regardless.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)


class EmbeddedEngine:
    """A causal LM from a local HF folder (default: SmolLM2-135M-Instruct), batched, whose
    weights a training loop may replace (``WeightSync``)."""

    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any
    context_length: int | None

    pause_modes: frozenset[PauseMode] = frozenset({"abort", "drain", "keep"})

    def __init__(
        self, model: Any, tokenizer: Any, *, device: torch.device, max_batch_size: int = 32
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        #: The version of the weights sampling now; changed only while no forward pass runs.
        self.policy_version = 0
        # One condition guards the state below; the worker never holds it during a forward pass.
        self._cond = threading.Condition()
        self._active: dict[str, _Request] = {}
        self._pending: deque[_Request] = deque()
        self._batch: list[_Request] = []
        #: True while the worker may run a forward pass (in a batch and not frozen).
        self._decoding = False
        self._paused: PauseMode | None = None
        #: True while new weights are copied in: no batch starts, no frozen batch goes on.
        self._loading = False
        self._closing = False
        #: Batches decoded and requests aborted so far (concurrent requests share batches).
        self.batches_run = 0
        self.aborted_total = 0
        #: Prompt tokens not recomputed thanks to shared prefixes.
        self.prefix_tokens_saved = 0
        self._worker = threading.Thread(target=self._work, name="rollway-embedded", daemon=True)
        self._worker.start()

    @classmethod
    def from_pretrained(
        cls, model: str | Path | None = None, *, device: str | None = None, max_batch_size: int = 32
    ) -> EmbeddedEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        path = resolve_model_path(None if model is None else str(model))
        torch_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        lm.to(torch_device).eval()
        return cls(lm, tokenizer, device=torch_device, max_batch_size=max_batch_size)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self._check_input(input_ids)
        check_sampling(sampling)
        room = self.context_length - len(input_ids)
        max_new = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        loop = asyncio.get_running_loop()
        request = _Request(
            request_id=request_id,
            input_ids=list(input_ids),
            sampling=sampling,
            max_new_tokens=max(max_new, 0),
            loop=loop,
            future=loop.create_future(),
            generator=make_generator(sampling.seed, self.device),
        )
        with self._cond:
            if self._closing:
                raise EngineError("the embedded engine is closed")
            if request_id in self._active:
                raise InvalidFieldsError(f"request id {request_id!r} is already in flight")
            self._active[request_id] = request
            self._pending.append(request)
            self._cond.notify_all()
        try:
            return await request.future
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise

    async def abort(self, request_id: str) -> None:
        with self._cond:
            request = self._active.get(request_id)
            if request is None:
                return
            if request in self._pending:  # never started: answer now, even while paused
                self._pending.remove(request)
                request.finish("abort")
                self._settle(request)
            else:
                request.abort_requested = True
                self._cond.notify_all()  # a frozen batch answers it at once

    async def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in self.pause_modes:
            raise ConfigError(f"pause mode {mode!r} is not one of {sorted(self.pause_modes)}")
        with self._cond:
            self._paused = mode
            if mode == "abort":
                for request in self._batch:
                    request.abort_requested = True
            self._cond.notify_all()
        await asyncio.to_thread(self._wait_until, lambda: not self._decoding)

    async def resume(self) -> None:
        with self._cond:
            self._paused = None
            self._cond.notify_all()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        self._check_version(version)
        # Read and check before pausing: the pause lasts only as long as the copy.
        state = await asyncio.to_thread(self._read_checked, source)
        with self._cond:
            paused = self._paused is not None
        if not paused:
            await self.pause("drain")
        try:
            await asyncio.to_thread(self._swap_weights, state, version)
        finally:
            if not paused:
                await self.resume()

    async def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        await asyncio.to_thread(self._worker.join)

    def _check_version(self, version: int) -> None:
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )

    def _read_checked(self, source: WeightSource) -> dict[str, torch.Tensor]:
        return check_state_dict(self.model, read_state_dict(source))

    def _swap_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._decoding and not self._loading)
            self._check_version(version)  # a concurrent update may have gone first
            self._loading = True
        copied = False
        try:
            copy_weights(self.model, state)
            copied = True
        finally:
            with self._cond:
                self._loading = False
                if copied:
                    self.policy_version = version
                self._cond.notify_all()

    def _wait_until(self, predicate: Callable[[], bool]) -> None:
        with self._cond:
            self._cond.wait_for(predicate)

    def _check_input(self, input_ids: list[int]) -> None:
        if not input_ids:
            raise InvalidFieldsError("input_ids is empty", param="input_ids")
        if len(input_ids) >= self.context_length:
            raise InvalidFieldsError(
                f"{len(input_ids)} input ids leave no room in the context of "
                f"{self.context_length} tokens",
                param="input_ids",
            )
        bad = next((t for t in input_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidFieldsError(f"token id {bad} is outside the vocabulary", "input_ids")

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run(batch)

    def _next_batch(self) -> list[_Request] | None:
        """Wait for requests and an open gate (not paused, not loading); None once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closing or (self._pending and self._gate_open()))
            if not (self._pending and self._gate_open()):  # closing: answer what waits
                while self._pending:
                    request = self._pending.popleft()
                    request.finish("abort")
                    self._settle(request)
                return None
            count = min(len(self._pending), self.max_batch_size)
            self._batch = [self._pending.popleft() for _ in range(count)]
            self._decoding = True
            return self._batch

    def _gate_open(self) -> bool:
        return self._paused is None and not self._loading

    def _run(self, batch: list[_Request]) -> None:
        error: BaseException | None = None
        self.batches_run += 1
        try:
            self._decode(batch)
        except Exception as exc:  # one bad batch fails its requests, never the worker
            error = EngineError(f"embedded engine failed: {exc!r}")
        with self._cond:
            for request in batch:
                self._settle(request, error)
            self._batch = []
            self._decoding = False
            self._cond.notify_all()

    def _settle(self, request: _Request, error: BaseException | None = None) -> None:
        """Answer ``request`` once (call with the condition held)."""
        if request.settled:
            return
        request.settled = True
        self.aborted_total += request.finish_reason == "abort"
        if self._active.get(request.request_id) is request:
            del self._active[request.request_id]
        request.resolve(error)

    def _between_steps(self, live: list[_Request]) -> bool:
        """Answer finished and aborted rows; freeze while paused with ``keep`` or loading.

        Returns whether any row goes on to the next forward pass.
        """
        with self._cond:
            while True:
                for request in live:
                    if request.abort_requested and not request.done:
                        request.finish("abort")
                    if request.done:
                        self._settle(request)
                if all(r.done for r in live):
                    return False
                if not (self._paused == "keep" or self._loading):
                    self._decoding = True
                    return True
                if self._closing:  # frozen rows would never go on
                    for request in live:
                        request.abort_requested = True
                    continue
                self._decoding = False
                self._cond.notify_all()
                self._cond.wait()

    @torch.inference_mode()
    def _decode(self, batch: list[_Request]) -> None:
        for request in batch:
            if request.abort_requested:
                request.finish("abort")
            elif request.max_new_tokens == 0:
                request.finish("length")
        live = [r for r in batch if r.finish_reason is None]
        if not live:
            return
        out, attention_mask, positions = self._prefill(live)
        while True:
            logits = out.logits[:, -1, :].float()
            next_ids = self._sample_step(live, logits)
            if not self._between_steps(live):
                return
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(live), 1)], 1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=attention_mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
                logits_to_keep=1,
            )

    def _prefill(self, live: list[_Request]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run the prompts; return the output, attention mask and position ids so far.

        Rows usually share a long prefix (system prompt, tools, few-shot examples, a group's
        task). That prefix is computed once and its KV cache repeated for every row; each row's
        own suffix follows, left-padded, so padding sits between prefix and suffix (masked,
        with explicit positions).
        """
        shared = _common_prefix_length([r.input_ids for r in live])
        shared = min(shared, min(len(r.input_ids) for r in live) - 1)
        cache = None
        if len(live) > 1 and shared >= _MIN_SHARED_PREFIX:
            prefix = torch.tensor([live[0].input_ids[:shared]], device=self.device)
            cache = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
            cache.batch_repeat_interleave(len(live))
            self.prefix_tokens_saved += shared * (len(live) - 1)
        else:
            shared = 0
        ids, mask = self._left_pad([r.input_ids[shared:] for r in live])
        positions = shared + (mask.cumsum(-1) - 1).clamp(min=0)
        prefix_mask = mask.new_ones(len(live), shared)
        attention_mask = torch.cat([prefix_mask, mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out, attention_mask, positions

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[index, width - len(row) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _sample_step(self, live: list[_Request], logits: torch.Tensor) -> torch.Tensor:
        logprobs = torch.log_softmax(logits, dim=-1)
        next_ids = torch.full((len(live),), self._pad_id, dtype=torch.long)
        for row, request in enumerate(live):
            if request.done:
                continue
            if request.abort_requested:
                request.finish("abort")
                continue
            try:
                token = choose_token(logits[row], request.sampling, request.generator)
            except Exception as exc:  # this row's failure, not its neighbours'
                request.error = EngineError(f"sampling failed: {exc}")
                continue
            request.output_ids.append(token)
            request.logprobs.append(float(logprobs[row, token].item()))
            # Weights change only while no forward pass runs, so these logits are this version's.
            request.versions.append(self.policy_version)
            next_ids[row] = token
            reason = self._stop_reason(request, token)
            if reason is not None:
                request.finish(reason)
        return next_ids.to(self.device)

    def _stop_reason(self, request: _Request, token: int) -> FinishReason | None:
        if token in self.eos_token_ids or token in request.sampling.stop_token_ids:
            return "stop"
        if request.sampling.stop and self._ends_in_stop_string(request):
            return "stop"
        if len(request.output_ids) >= request.max_new_tokens:
            return "length"
        return None

    def _ends_in_stop_string(self, request: _Request) -> bool:
        # Each token decodes to at least one character, so this window holds any stop string
        # that the newest token completed.
        window = max(len(s) for s in request.sampling.stop) + 2
        tail = self.tokenizer.decode(request.output_ids[-window:], skip_special_tokens=False)
        return any(s in tail for s in request.sampling.stop)


def _common_prefix_length(rows: list[list[int]]) -> int:
    first = rows[0]
    length = len(first)
    for row in rows[1:]:
        length = min(length, len(row))
        for i in range(length):
            if row[i] != first[i]:
                length = i
                break
    return length


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
