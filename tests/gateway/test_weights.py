"""Weight updates through the gateway: a turn the update aborts is sent again and recorded once
under the new version, a user's cancel is still a cancel, every token carries its version, and
the admin routes check what they are given."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import (
    ConfigError,
    EngineError,
    InvalidFieldsError,
    RequestError,
    RolloutClosedError,
)
from rollway.gateway import Gateway, create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.generation import ChatResult, GenerationChunk, GenerationResult, SamplingParams
from rollway.web.background_server import BackgroundServer

USER = [{"role": "user", "content": "hi"}]


class CountingSim(SimEngine):
    """The simulated engine, counting generations per request id."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.sent: Counter[str] = Counter()
        self.started = asyncio.Event()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self.sent[request_id] += 1
        self.started.set()
        return await super().generate(input_ids, sampling, request_id)


def gateway_over(engine: object, renderer: ChatRenderer) -> Gateway:
    return Gateway(engine, renderer, model_name="sim")  # type: ignore[arg-type]


async def start_turn(gateway: Gateway, engine: CountingSim, rollout_id: str) -> asyncio.Task:
    gateway.register(rollout_id, {})
    engine.started.clear()
    turn = asyncio.create_task(gateway.chat(rollout_id, {"messages": USER}))
    await asyncio.wait_for(engine.started.wait(), 5)
    return turn


async def test_an_update_in_abort_mode_reissues_the_turn_under_the_new_version(
    renderer: ChatRenderer,
) -> None:
    engine = CountingSim(SimConfig(latency_s=0.5, output_len=6))
    gateway = gateway_over(engine, renderer)
    turn = await start_turn(gateway, engine, "r1")
    update = await gateway.weights.update("ckpt-1", mode="abort")
    answer = await turn  # the agent sees an answer, only later
    assert update.version == 1 and engine.updates == [("ckpt-1", 1)]
    trajectory = await gateway.trajectory("r1")
    (recorded,) = trajectory.turns
    assert recorded.reissued == 1 and recorded.request_id == "r1-1.1"
    assert recorded.policy_versions == [1] * 6 == [1] * len(answer.completion_ids)
    assert engine.sent == {"r1-1": 1, "r1-1.1": 1}  # no request id sent twice
    assert not trajectory.is_cancelled and trajectory.engine_errors == []
    assert gateway.metrics.turns_reissued._value.get() == 1


async def test_a_cancel_during_an_update_is_still_a_cancel(renderer: ChatRenderer) -> None:
    engine = CountingSim(SimConfig(latency_s=5.0))
    gateway = gateway_over(engine, renderer)
    turn = await start_turn(gateway, engine, "r2")
    await gateway.weights.pause("abort")
    await gateway.cancel("r2")
    with pytest.raises(RolloutClosedError):
        await turn
    await gateway.weights.resume()
    # The pause aborted r2-1, so it was sent again (waiting for resume); the cancel ended that
    # wait, and nothing was sent after it.
    assert engine.sent == {"r2-1": 1, "r2-1.1": 1}
    assert (await gateway.trajectory("r2")).is_cancelled


async def test_drain_finishes_the_turn_on_the_old_weights_and_the_next_turn_uses_the_new(
    renderer: ChatRenderer,
) -> None:
    engine = CountingSim(SimConfig(latency_s=0.3, output_len=3))
    gateway = gateway_over(engine, renderer)
    turn = await start_turn(gateway, engine, "r3")
    update = asyncio.create_task(gateway.weights.update("ckpt", mode="drain"))
    first = await turn
    await update
    second = await gateway.chat(
        "r3", {"messages": [*USER, first.message, {"role": "user", "content": "more"}]}
    )
    trajectory = await gateway.trajectory("r3")
    assert [t.policy_versions for t in trajectory.turns] == [[0] * 3, [1] * 3]
    assert [t.reissued for t in trajectory.turns] == [0, 0]
    # One segment: the sample's versions follow its tokens, -1 on the glue between turns.
    (sample,) = trajectory.samples
    assert sample.policy_versions is not None
    assert len(sample.policy_versions) == len(sample.response_ids)
    for version, mask in zip(sample.policy_versions, sample.loss_mask, strict=True):
        assert (version == -1) == (mask == 0)
    assert sample.policy_versions[:3] == [0, 0, 0] and sample.policy_versions[-3:] == [1, 1, 1]
    assert len(second.completion_ids) == 3


async def test_keep_continues_the_turn_and_stamps_each_token(renderer: ChatRenderer) -> None:
    engine = CountingSim(SimConfig(latency_s=0.0, per_token_s=0.05, output_len=10))
    gateway = gateway_over(engine, renderer)
    turn = await start_turn(gateway, engine, "r4")
    await asyncio.sleep(0.25)  # about half-way
    await gateway.weights.update("ckpt", mode="keep")
    await turn
    (recorded,) = (await gateway.trajectory("r4")).turns
    versions = recorded.policy_versions
    assert versions is not None and versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions) and recorded.reissued == 0
    assert engine.sent == {"r4-1": 1}


async def test_an_engine_that_aborts_forever_fails_the_turn_after_max_reissues(
    renderer: ChatRenderer,
) -> None:
    class AlwaysAborts(SimEngine):
        async def generate(
            self, input_ids: list[int], sampling: SamplingParams, request_id: str
        ) -> GenerationResult:
            return GenerationResult([], [], "abort", [])

    gateway = Gateway(AlwaysAborts(), renderer, model_name="sim", max_reissues=3)
    gateway.register("r5", {})
    with pytest.raises(EngineError, match="aborted turn r5-1 4 times"):
        await gateway.chat("r5", {"messages": USER})
    assert (await gateway.trajectory("r5")).engine_errors


async def test_an_abort_mode_pause_lets_a_protected_turn_finish_first(
    renderer: ChatRenderer,
) -> None:
    # Protected from its first send (the default protects after two): the caller's own pause
    # in abort mode waits for it, and it keeps the version that sampled it.
    engine = CountingSim(SimConfig(latency_s=0.3, output_len=3))
    gateway = Gateway(engine, renderer, model_name="sim", protect_after_reissues=0)
    turn = await start_turn(gateway, engine, "r7")
    await gateway.weights.pause("abort")
    await gateway.weights.update("ckpt")  # within the pause: loads only
    await gateway.weights.resume()
    await turn
    (recorded,) = (await gateway.trajectory("r7")).turns
    assert recorded.reissued == 0 and recorded.policy_versions == [0, 0, 0]
    assert engine.sent == {"r7-1": 1} and engine.policy_version == 1
    with pytest.raises(ConfigError, match="protect_after must be a whole number"):
        Gateway(engine, renderer, model_name="sim", protect_after_reissues=-1)


async def test_versions_that_do_not_match_the_tokens_are_an_engine_error(
    renderer: ChatRenderer,
) -> None:
    class Miscounts(SimEngine):
        async def generate(
            self, input_ids: list[int], sampling: SamplingParams, request_id: str
        ) -> GenerationResult:
            return GenerationResult([5, 6], [-1.0, -1.0], "stop", [0])

    gateway = gateway_over(Miscounts(), renderer)
    gateway.register("r6", {})
    with pytest.raises(EngineError, match="1 policy versions for 2 tokens"):
        await gateway.chat("r6", {"messages": USER})


async def test_updates_are_checked_before_the_engine_pauses(renderer: ChatRenderer) -> None:
    engine = CountingSim(SimConfig())
    gateway = gateway_over(engine, renderer)
    await gateway.weights.update("a", version=5)
    with pytest.raises(InvalidFieldsError, match="does not follow the engine's version 5"):
        await gateway.weights.update("b", version=5)
    with pytest.raises(InvalidFieldsError, match="unknown pause mode"):
        await gateway.weights.update("b", mode="later")  # type: ignore[arg-type]
    assert engine.policy_version == 5 and gateway.weights.paused is None

    class Fixed:  # an engine without weight sync (a hosted API, say)
        async def generate(self, *args: object) -> GenerationResult:
            raise AssertionError

        async def abort(self, request_id: str) -> None: ...

        async def close(self) -> None: ...

    fixed = gateway_over(Fixed(), renderer)
    with pytest.raises(RequestError, match="cannot take new weights"):
        await fixed.weights.update("a")
    assert fixed.weights.describe() == PolicyState(None, None, ())


@pytest.fixture
def served(renderer: ChatRenderer) -> Iterator[tuple[httpx.Client, Gateway]]:
    gateway = Gateway(SimEngine(SimConfig(latency_s=0.3)), renderer, model_name="sim")
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        headers = {"Authorization": f"Bearer {admin_key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30.0) as client:
            yield client, gateway


@pytest.mark.timeout(60)
def test_the_admin_routes_update_pause_and_report_the_version(
    served: tuple[httpx.Client, Gateway],
) -> None:
    admin, _ = served
    assert (
        admin.post(
            "/admin/weights", json={"source": "x"}, headers={"Authorization": ""}
        ).status_code
        == 401
    )
    assert admin.get("/admin/policy").json() == {
        "policy_version": 0,
        "paused": None,
        "pause_modes": ["abort", "drain", "keep"],
        "engine_shared": False,
    }
    # Only an engine whose servers another gateway loads can take a version it did not load.
    adopted = admin.post("/admin/weights", json={"source": "/ckpt/step-1", "loaded": True})
    assert adopted.status_code == 422 and adopted.json()["error"]["param"] == "loaded"
    assert "holds its own weights" in adopted.text
    answer = admin.post("/admin/weights", json={"source": "/ckpt/step-1", "mode": "drain"})
    assert answer.status_code == 200 and answer.json()["policy_version"] == 1
    stale = admin.post("/admin/weights", json={"source": "/ckpt/old", "version": 1})
    assert stale.status_code == 422 and stale.json()["error"]["param"] == "version"
    for bad in ("3", True, 2**53 + 1, -1):
        refused = admin.post("/admin/weights", json={"source": "/ckpt", "version": bad})
        assert refused.status_code == 422, bad
    typo = admin.post("/admin/weights", json={"source": "/ckpt", "mdoe": "drain"})
    assert typo.status_code == 422 and "mdoe" in typo.text
    assert admin.post("/admin/pause", json={"mode": "drain"}).json()["paused"] == "drain"
    # While paused, a turn waits; it answers once the gateway resumes.
    key = admin.post("/v1/rollouts/p1/register", json={}).json()["api_key"]
    with httpx.Client(base_url=str(admin.base_url), timeout=30.0) as agent:
        with pytest.raises(httpx.ReadTimeout):
            agent.post(
                "/v1/rollouts/p1/chat/completions",
                json={"messages": USER},
                headers={"Authorization": f"Bearer {key}"},
                timeout=1.0,
            )
        admin.post("/admin/weights", json={"source": "/ckpt/step-2"})  # loads, stays paused
        assert admin.get("/admin/policy").json()["paused"] == "drain"
        assert admin.post("/admin/resume").json() == {
            "policy_version": 2,
            "paused": None,
            "pause_modes": ["abort", "drain", "keep"],
            "engine_shared": False,
        }
        reply = agent.post(
            "/v1/rollouts/p1/chat/completions",
            json={"messages": USER},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert reply.status_code == 200
    assert "rollway_policy_version 2.0" in admin.get("/metrics").text


def test_new_weights_are_checked_where_they_are_asked() -> None:
    assert NewWeights.of("/ckpt", 2, "drain") == NewWeights("/ckpt", 2, "drain")
    with pytest.raises(InvalidFieldsError, match="unknown pause mode 'later'") as bad_mode:
        NewWeights.of("/ckpt", mode="later")
    assert bad_mode.value.param == "mode"
    for bad in ("", 5, None):
        with pytest.raises(InvalidFieldsError, match="a checkpoint folder or a state dict"):
            NewWeights.of(bad)


@pytest.mark.timeout(60)
def test_a_served_update_is_sent_and_answered_as_typed_values(
    served: tuple[httpx.Client, Gateway],
) -> None:
    admin, gateway = served
    admin_key = admin.headers["Authorization"].removeprefix("Bearer ")

    async def update() -> tuple[WeightUpdate, WeightUpdate, PolicyState]:
        remote = RemoteGateway(str(admin.base_url), admin_key=admin_key)
        try:
            first = await remote.update_weights(NewWeights("/ckpt/step-1", mode="drain"))
            with pytest.raises(ConfigError, match="a checkpoint folder path, not dict"):
                await remote.update_weights(NewWeights({"w": [1.0]}))
            second = await remote.update_weights(NewWeights("/ckpt/step-3", 3, "keep"))
            return first, second, await remote.policy()
        finally:
            await remote.close()

    first, second, policy = asyncio.run(update())
    assert policy == PolicyState(3, None, ("abort", "drain", "keep"))
    assert (first.version, first.mode, second.version, second.mode) == (1, "drain", 3, "keep")
    assert first.pause_s >= 0 and first.load_s >= 0
    assert gateway.weights.version == 3 and gateway.weights.paused is None


async def test_what_the_engine_refuses_is_a_request_error(renderer: ChatRenderer) -> None:
    # A vLLM server without VLLM_SERVER_DEV_MODE, say: the caller's to fix, not a 500.

    class NoDevMode(SimEngine):
        async def pause(self, mode: str = "abort") -> None:  # type: ignore[override]
            raise ConfigError("start vLLM with VLLM_SERVER_DEV_MODE=1", "engine")

    gateway = gateway_over(NoDevMode(), renderer)
    with pytest.raises(RequestError, match="VLLM_SERVER_DEV_MODE"):
        await gateway.weights.pause("abort")
    with pytest.raises(RequestError, match="VLLM_SERVER_DEV_MODE"):
        await gateway.weights.update("/ckpt")
    with pytest.raises(InvalidFieldsError, match="not 5"):
        await gateway.weights.update(5)  # type: ignore[arg-type]
    assert gateway.weights.paused is None


class StampingSim(SimEngine):
    """The simulated engine, keeping the versions it stamped on each request's tokens."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.stamped: dict[str, list[int]] = {}

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        result = await super().generate(input_ids, sampling, request_id)
        self.stamped[request_id] = list(result.policy_versions or [])
        return result

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        stamped = self.stamped.setdefault(request_id, [])
        async with contextlib.aclosing(
            super().generate_stream(input_ids, sampling, request_id)
        ) as chunks:
            async for chunk in chunks:
                stamped += chunk.policy_versions or []
                yield chunk


async def update_while(gateway: Gateway, turns: list[asyncio.Task], every_s: float) -> int:
    """Abort-mode updates every ``every_s`` seconds until the turns end; how many were made."""
    made = 0
    while not all(turn.done() for turn in turns):
        await asyncio.sleep(every_s)  # the trainer's pace, not a synchronisation
        await gateway.weights.update(f"ckpt-{made}", mode="abort")
        made += 1
    return made


async def streamed_turn(gateway: Gateway, rollout_id: str) -> ChatResult:
    pieces = [p async for p in gateway.chat_stream(rollout_id, {"messages": USER})]
    assert isinstance(pieces[-1], ChatResult)
    return pieces[-1]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_updates_faster_than_a_turn_never_starve_it(
    renderer: ChatRenderer, stream: bool
) -> None:
    # Updates every 0.2 s, turns of 0.8 s, the gateway's defaults (max_reissues 16): each turn
    # is aborted at most twice, then the next update lets it finish on its weights.
    engine = StampingSim(SimConfig(latency_s=0.8, per_token_s=0.01, output_len=4))
    gateway = gateway_over(engine, renderer)
    ids = [f"u{i}" for i in range(4)]
    for rollout_id in ids:
        gateway.register(rollout_id, {})
    turn = streamed_turn if stream else lambda g, r: g.chat(r, {"messages": USER})
    turns = [asyncio.create_task(turn(gateway, rollout_id)) for rollout_id in ids]
    made = await update_while(gateway, turns, every_s=0.2)
    answers = await asyncio.gather(*turns)
    assert made >= 3 and engine.policy_version == made
    assert [len(a.completion_ids or []) for a in answers] == [4] * 4
    reissued = []
    for rollout_id in ids:
        trajectory = await gateway.trajectory(rollout_id)
        (recorded,) = trajectory.turns
        assert trajectory.engine_errors == [] and not trajectory.is_cancelled
        # Every token carries the version the engine stamped when it sampled it, and one turn
        # spans no update: what its weights were when it started is what sampled it all.
        sent = [f"{rollout_id}-1"] + [
            f"{rollout_id}-1.{n}" for n in range(1, recorded.reissued + 1)
        ]
        assert recorded.policy_versions == [v for s in sent for v in engine.stamped[s]]
        assert len(set(recorded.policy_versions)) == 1
        reissued.append(recorded.reissued)
    assert max(reissued) == 2  # the default bound, reached: the updates did abort them
    assert gateway.metrics.engine_errors._value.get() == 0
