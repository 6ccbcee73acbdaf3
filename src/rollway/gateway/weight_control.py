"""Weight updates through the gateway: one at a time, paused around, checked before they start.

A training loop calls ``update`` (in process, or over ``POST /admin/weights``): the engine pauses
in the chosen mode, loads the new weights, and resumes. Turns that the pause aborted come back
to the gateway finished ``abort`` while their rollout is not cancelled; the gateway sends them
again, under a new request id, and they wait in the engine until it resumes. A turn already sent
again ``protect_after`` times is protected: the next pause in abort mode waits for it to finish
(drains it) first, so updates faster than a turn never starve it, and its tokens keep the
version whose weights sampled them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, get_args

from rollway.engines.base import PauseMode, SharedWeights, WeightSource, WeightSync
from rollway.errors import ConfigError, InvalidFieldsError, RequestError

log = logging.getLogger(__name__)

PAUSE_MODES: tuple[str, ...] = get_args(PauseMode)


def is_pause_mode(mode: object) -> TypeGuard[PauseMode]:
    return mode in PAUSE_MODES


def checked_mode(mode: object) -> PauseMode:
    """``mode`` as a ``PauseMode``, or an error naming the known ones."""
    if not is_pause_mode(mode):
        raise InvalidFieldsError(
            f"unknown pause mode {mode!r}: expected one of {', '.join(PAUSE_MODES)}", "mode"
        )
    return mode


def checked_source(source: object) -> WeightSource:
    """``source`` as a ``WeightSource`` (a folder, or a state dict), or an error naming it."""
    if not isinstance(source, str | os.PathLike | Mapping) or source == "":
        raise InvalidFieldsError(
            f"weights come as a checkpoint folder or a state dict, not {source!r:.60}", "source"
        )
    return source


@dataclass(frozen=True, slots=True)
class NewWeights:
    """An update asked for: ``source`` (a checkpoint folder or a state dict) loaded as
    ``version`` (None: the engine's next), the engine paused in ``mode`` around the load.
    Built once where a caller asks (``of``) and carried as is to the gateway's engine.
    ``loaded``: another gateway on the same shared server loaded it already, so this one's
    engine only adopts the version (the ``--workers`` front sets it; see ``SharedWeights``)."""

    source: WeightSource
    version: int | None = None
    mode: PauseMode = "abort"
    loaded: bool = False

    @classmethod
    def of(cls, source: object, version: int | None = None, mode: object = "abort") -> NewWeights:
        """What a caller passed, checked: a bad source or mode is named here, not in a worker."""
        return cls(checked_source(source), version, checked_mode(mode))


def served_body(new: NewWeights) -> dict[str, Any]:
    """``new`` as ``POST /admin/weights`` takes it: the source a folder path, since in-memory
    weights cannot cross HTTP."""
    source = new.source
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(
            "a served gateway takes new weights as a checkpoint folder path, not "
            f"{type(source).__name__}: save them (save_pretrained) where its engine reads",
            "source",
        )
    body: dict[str, Any] = {"source": os.fspath(source), "version": new.version, "mode": new.mode}
    if new.loaded:  # named only when set: a gateway without shared weights never sees it
        body["loaded"] = True
    return body


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """What one update did: the version now sampling, and how long each phase took."""

    version: int
    mode: PauseMode
    pause_s: float
    load_s: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``POST /admin/weights``'s answer (and, with ``stale_restarts``, of
        ``RolloutClient.update_weights``)."""
        return {
            "policy_version": self.version,
            "mode": self.mode,
            "pause_s": self.pause_s,
            "load_s": self.load_s,
        }

    @classmethod
    def from_dict(cls, answer: Mapping[str, Any]) -> WeightUpdate:
        """``to_dict``'s JSON read back (a served gateway's answer)."""
        mode = answer["mode"]
        if not is_pause_mode(mode):
            raise ValueError(f"a weight update answered an unknown pause mode {mode!r}")
        return cls(int(answer["policy_version"]), mode, answer["pause_s"], answer["load_s"])


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The engine's policy: the version sampling now (None: the engine has no versions), the
    pause in force, the pause modes the engine supports, and whether its weights live in a
    server other gateways share (``engine_shared``: one loads an update, the others adopt)."""

    version: int | None
    paused: PauseMode | None
    pause_modes: tuple[PauseMode, ...]
    engine_shared: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``GET /admin/policy`` (and of the pause and resume routes)."""
        return {
            "policy_version": self.version,
            "paused": self.paused,
            "pause_modes": list(self.pause_modes),
            "engine_shared": self.engine_shared,
        }

    @classmethod
    def from_dict(cls, answer: Mapping[str, Any]) -> PolicyState:
        """``to_dict``'s JSON read back (a served gateway's answer)."""
        paused = answer["paused"]
        return cls(
            answer["policy_version"],
            None if paused is None else checked_mode(paused),
            tuple(checked_mode(mode) for mode in answer["pause_modes"]),
            bool(answer.get("engine_shared", False)),
        )


class ProtectedTurns:
    """The engine calls of turns that abort-mode pauses already sent back ``after`` times:
    a pause in abort mode waits for them to finish before it aborts the others."""

    def __init__(self, after: int) -> None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ConfigError(f"protect_after must be a whole number >= 0, not {after!r}")
        self.after = after
        self._running = 0
        self._none_running = asyncio.Event()
        self._none_running.set()

    @contextlib.contextmanager
    def hold(self, reissued: int) -> Iterator[None]:
        """Around one engine call of a turn sent ``reissued`` times before. Entered before the
        request is sent, so a pause that starts later sees it."""
        if reissued < self.after:
            yield
            return
        self._running += 1
        self._none_running.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self._none_running.set()

    async def finished(self) -> None:
        # Counted again after each wake: a protected call may start between the set and here.
        while self._running:
            await self._none_running.wait()


class WeightControl:
    """The gateway's handle on its engine's weights; refuses what the engine cannot do.
    ``protect_after``: how many times an update may abort one turn (see ``ProtectedTurns``)."""

    def __init__(self, engine: object, protect_after: int = 2) -> None:
        self.engine = engine
        self.paused: PauseMode | None = None
        self.protected = ProtectedTurns(protect_after)
        self._lock = asyncio.Lock()

    @property
    def supported(self) -> bool:
        return isinstance(self.engine, WeightSync)

    @property
    def version(self) -> int | None:
        """The version sampling now; None when the engine has no versions."""
        return self.engine.policy_version if isinstance(self.engine, WeightSync) else None

    def describe(self) -> PolicyState:
        """``engine_shared``: the engine's weights live in servers other gateways may use too
        (a remote engine), so one of them loads an update and the others adopt it."""
        engine = self.engine
        modes = tuple(sorted(engine.pause_modes)) if isinstance(engine, WeightSync) else ()
        shared = isinstance(engine, SharedWeights)
        return PolicyState(self.version, self.paused, modes, shared)

    async def update(
        self,
        source: WeightSource,
        version: int | None = None,
        mode: PauseMode = "abort",
        *,
        loaded: bool = False,
    ) -> WeightUpdate:
        """Pause (``mode``), load ``source`` as ``version`` (default: the next one), resume.
        Within a pause the caller made, it loads only and leaves the engine paused. ``loaded``:
        another gateway on the same servers loaded it; the engine only adopts the version."""
        if loaded:
            return await self._adopt(source, version, mode)
        engine = self._engine()
        self._check_mode(engine, mode)
        checked_source(source)
        async with self._lock:
            version = engine.policy_version + 1 if version is None else version
            self._check_version(engine, version)
            held = self.paused  # the caller's pause, if it made one
            own_pause = held is None
            started = time.perf_counter()
            if own_pause:
                await self._pause_engine(engine, mode)
            paused = time.perf_counter()
            try:
                await _load(engine, source, version)
            except BaseException as exc:
                await self._after_failed_load(engine, exc, version, mode if own_pause else None)
                raise
            if own_pause:
                await engine.resume()
            done = time.perf_counter()
        log.info("weights updated", extra={"stage": "weights", "version": version})
        return WeightUpdate(version, held or mode, paused - started, done - paused)

    async def _adopt(
        self, source: WeightSource, version: int | None, mode: PauseMode
    ) -> WeightUpdate:
        engine = self._engine()
        if not isinstance(engine, SharedWeights):
            name = type(engine).__name__
            raise InvalidFieldsError(
                f"this gateway's engine ({name}) holds its own weights: it must load them, "
                "no other gateway loads them for it",
                "loaded",
            )
        async with self._lock:
            version = engine.policy_version + 1 if version is None else version
            self._check_version(engine, version)
            await _engine_side(engine.adopt_weights(source, version))
        log.info("weights adopted", extra={"stage": "weights", "version": version})
        return WeightUpdate(version, self.paused or mode, 0.0, 0.0)

    async def pause(self, mode: PauseMode = "abort") -> None:
        engine = self._engine()
        self._check_mode(engine, mode)
        async with self._lock:
            await self._pause_engine(engine, mode)
            self.paused = mode

    async def resume(self) -> None:
        engine = self._engine()
        async with self._lock:
            await _engine_side(engine.resume())
            self.paused = None

    async def _pause_engine(self, engine: WeightSync, mode: PauseMode) -> None:
        """In abort mode, protected turns finish first; not within a pause the caller made,
        where they may be waiting in the engine for its resume."""
        if mode == "abort" and self.paused is None:
            await self.protected.finished()
        await _engine_side(engine.pause(mode))

    async def _after_failed_load(
        self, engine: WeightSync, error: BaseException, version: int, own_pause: PauseMode | None
    ) -> None:
        """Log the failure with its cause and resume the pause the update made. Should the
        resume fail too, the pause stays on record (``describe`` agrees with the engine) and
        the load's error, not the resume's, is what the caller sees."""
        log.warning(
            "weight update to version %d failed: %s",
            version,
            error,
            extra={"stage": "weights", "version": version},
        )
        if own_pause is None:
            return
        try:
            await engine.resume()
        except Exception as exc:
            self.paused = own_pause
            log.error(
                "resume after the failed update failed, still paused (POST /admin/resume): %s",
                exc,
                extra={"stage": "weights"},
            )

    def _engine(self) -> WeightSync:
        if not isinstance(self.engine, WeightSync):
            name = type(self.engine).__name__
            raise RequestError(f"this gateway's engine ({name}) cannot take new weights")
        return self.engine

    @staticmethod
    def _check_mode(engine: WeightSync, mode: str) -> None:
        if checked_mode(mode) not in engine.pause_modes:
            known = ", ".join(sorted(engine.pause_modes))
            raise InvalidFieldsError(
                f"this engine cannot pause with {mode!r}; it supports {known}", "mode"
            )

    @staticmethod
    def _check_version(engine: WeightSync, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= 2**53:
            raise InvalidFieldsError(
                f"version must be a whole number from 0 to 2**53, not {version!r}", "version"
            )
        if version <= engine.policy_version:
            raise InvalidFieldsError(
                f"version {version} does not follow the engine's version {engine.policy_version}",
                "version",
            )


async def _engine_side(call: Awaitable[None]) -> None:
    """What the engine refuses (a server without weight routes, a mode it lacks) is the
    caller's to fix: a 400 naming it, not a server error."""
    try:
        await call
    except ConfigError as exc:
        raise RequestError(str(exc), exc.param) from exc


async def _load(engine: WeightSync, source: WeightSource, version: int) -> None:
    """The engine's own refusal of a source (a bad folder, wrong shapes) names the source."""
    try:
        await engine.update_weights(source, version)
    except ConfigError as exc:
        raise InvalidFieldsError(str(exc), exc.param or "source") from exc
