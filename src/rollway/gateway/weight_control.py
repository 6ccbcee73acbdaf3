"""Weight updates through the gateway: one at a time, paused around, checked before they start.

A training loop calls ``update`` (in process, or over ``POST /admin/weights``): the engine pauses
in the chosen mode, loads the new weights, and resumes. Turns that the pause aborted come back
to the gateway finished ``abort`` while their rollout is not cancelled; the gateway sends them
again, under a new request id, and they wait in the engine until it resumes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from rollway.engines.base import PauseMode, WeightSource, WeightSync
from rollway.errors import ConfigError, InvalidFieldsError, RequestError

log = logging.getLogger(__name__)

PAUSE_MODES: tuple[str, ...] = get_args(PauseMode)


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """What one update did: the version now sampling, and how long each phase took."""

    version: int
    mode: PauseMode
    pause_s: float
    load_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy_version": self.version,
            "mode": self.mode,
            "pause_s": self.pause_s,
            "load_s": self.load_s,
        }


class WeightControl:
    """The gateway's handle on its engine's weights; refuses what the engine cannot do."""

    def __init__(self, engine: object) -> None:
        self.engine = engine
        self.paused: PauseMode | None = None
        self._lock = asyncio.Lock()

    @property
    def supported(self) -> bool:
        return isinstance(self.engine, WeightSync)

    @property
    def version(self) -> int | None:
        """The version sampling now; None when the engine has no versions."""
        return self.engine.policy_version if isinstance(self.engine, WeightSync) else None

    def describe(self) -> dict[str, Any]:
        engine = self.engine
        modes = sorted(engine.pause_modes) if isinstance(engine, WeightSync) else []
        return {"policy_version": self.version, "paused": self.paused, "pause_modes": modes}

    async def update(
        self, source: WeightSource, version: int | None = None, mode: PauseMode = "abort"
    ) -> WeightUpdate:
        """Pause (``mode``), load ``source`` as ``version`` (default: the next one), resume.
        Within a pause the caller made, it loads only and leaves the engine paused."""
        engine = self._engine()
        self._check_mode(engine, mode)
        if not isinstance(source, str | os.PathLike | Mapping) or source == "":
            raise InvalidFieldsError(
                f"weights come as a checkpoint folder or a state dict, not {source!r:.60}",
                "source",
            )
        async with self._lock:
            version = engine.policy_version + 1 if version is None else version
            self._check_version(engine, version)
            own_pause = self.paused is None
            started = time.perf_counter()
            if own_pause:
                await _engine_side(engine.pause(mode))
            paused = time.perf_counter()
            try:
                await _load(engine, source, version)
            finally:
                if own_pause:
                    await engine.resume()
            done = time.perf_counter()
        log.info("weights updated", extra={"stage": "weights", "version": version})
        return WeightUpdate(version, mode if own_pause else self.paused, paused - started,
                            done - paused)  # fmt: skip

    async def pause(self, mode: PauseMode = "abort") -> None:
        engine = self._engine()
        self._check_mode(engine, mode)
        async with self._lock:
            await _engine_side(engine.pause(mode))
            self.paused = mode

    async def resume(self) -> None:
        engine = self._engine()
        async with self._lock:
            await _engine_side(engine.resume())
            self.paused = None

    def _engine(self) -> WeightSync:
        if not isinstance(self.engine, WeightSync):
            name = type(self.engine).__name__
            raise RequestError(f"this gateway's engine ({name}) cannot take new weights")
        return self.engine

    @staticmethod
    def _check_mode(engine: WeightSync, mode: str) -> None:
        if mode not in PAUSE_MODES:
            raise InvalidFieldsError(
                f"unknown pause mode {mode!r}: expected one of {', '.join(PAUSE_MODES)}", "mode"
            )
        if mode not in engine.pause_modes:
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
