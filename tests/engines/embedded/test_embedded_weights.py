"""The embedded engine's weight sync: pause (abort, drain, keep), update in place, resume.

The module loads its own engine (updates would leak into the session's shared one); an
autouse fixture puts the original weights back after each test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import torch

from rollway.engines.base import WeightSync
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.embedded.decode_batch import cache_argument
from rollway.errors import ConfigError, EngineError
from rollway.generation import SamplingParams
from tests.engines.embedded.test_embedded import next_turn, prompt, reference_logprobs

#: The weight the tests perturb; noise of a tenth of its spread moves logprobs by far over 0.01.
KEY = "model.layers.29.mlp.down_proj.weight"
#: An early weight: unlike ``KEY`` (the last layer's MLP), it changes every layer's KV.
EARLY = "model.layers.0.self_attn.v_proj.weight"
LONG = SamplingParams(temperature=1.0, max_tokens=200, seed=5)
SHORT = SamplingParams(temperature=1.0, max_tokens=4, seed=6)


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    loaded = EmbeddedEngine.from_pretrained(max_batch_size=2)
    yield loaded
    asyncio.run(loaded.close())


@pytest.fixture(scope="module")
def original(engine: EmbeddedEngine) -> torch.Tensor:
    return engine.model.state_dict()[KEY].clone()


@pytest.fixture(autouse=True)
async def restore(engine: EmbeddedEngine, original: torch.Tensor) -> AsyncIterator[None]:
    yield
    await engine.resume()
    await engine.update_weights(with_weight(engine, original), engine.policy_version + 1)


def with_weight(engine: EmbeddedEngine, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """The engine's state dict with ``KEY`` replaced (the other tensors are its own)."""
    return {**engine.model.state_dict(), KEY: tensor}


def perturbed(original: torch.Tensor, seed: int = 0) -> torch.Tensor:
    noise = torch.randn(original.shape, generator=torch.Generator().manual_seed(seed))
    return original + noise.to(original.device) * original.std() * 0.1


def tensor(engine: EmbeddedEngine, ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], device=engine.device)


def current(engine: EmbeddedEngine) -> torch.Tensor:
    return engine.model.state_dict()[KEY]


async def wait_for_tokens(engine: EmbeddedEngine, request_id: str, count: int) -> None:
    """Until the worker has sampled ``count`` tokens for ``request_id``."""
    for _ in range(2000):
        request = engine._active.get(request_id)
        if request is not None and len(request.output_ids) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{request_id} never reached {count} tokens")


def test_the_engine_declares_weight_sync(engine: EmbeddedEngine) -> None:
    assert isinstance(engine, WeightSync)
    assert engine.pause_modes == {"abort", "drain", "keep"}


async def test_new_weights_sample_and_score_the_next_generation(
    engine: EmbeddedEngine, original: torch.Tensor
) -> None:
    ids = prompt(engine, "Name three animals.")
    version = engine.policy_version + 1
    await engine.update_weights(with_weight(engine, perturbed(original)), version)
    assert engine.policy_version == version
    result = await engine.generate(ids, SamplingParams(max_tokens=6, seed=3), "new-weights")
    assert result.policy_versions == [version] * len(result.output_ids)
    assert result.logprob_kind == "raw_logprobs"
    assert result.logprobs == pytest.approx(
        reference_logprobs(engine, ids, result.output_ids), abs=1e-3
    )
    await engine.update_weights(with_weight(engine, original), version + 1)
    old = reference_logprobs(engine, ids, result.output_ids)
    assert max(abs(a - b) for a, b in zip(old, result.logprobs, strict=True)) > 0.01


async def test_keep_freezes_a_generation_and_continues_it_on_the_new_weights(
    engine: EmbeddedEngine, original: torch.Tensor
) -> None:
    ids = prompt(engine, "Write a long story about a lighthouse keeper.")
    old, new = engine.policy_version, engine.policy_version + 1
    sampling = SamplingParams(temperature=1.0, max_tokens=16, seed=11)
    task = asyncio.create_task(engine.generate(ids, sampling, "kept"))
    await wait_for_tokens(engine, "kept", 3)
    await engine.pause("keep")
    frozen = engine._active["kept"]
    before = len(frozen.output_ids)
    new_weight = perturbed(original, seed=1)
    await engine.update_weights(with_weight(engine, new_weight), new)
    assert len(frozen.output_ids) == before and not task.done()  # nothing decoded while paused
    await engine.resume()
    result = await task
    assert len(engine.prefix_cache) == 0  # its KV mixes two versions: never reused
    assert result.finish_reason == "length" and len(result.output_ids) == 16
    assert result.policy_versions == [old] * before + [new] * (16 - before)
    # Reference: the old weights' KV cache up to the last old token, then the new weights.
    out = result.output_ids
    await engine.update_weights(with_weight(engine, original), new + 1)
    with torch.inference_mode():
        head = engine.model(tensor(engine, ids + out[: before - 1]), use_cache=True)
    await engine.update_weights(with_weight(engine, new_weight), new + 2)
    with torch.inference_mode():
        kv = cache_argument(engine.model)
        tail = engine.model(tensor(engine, out[before - 1 : -1]), **{kv: head[kv]})
    logits = torch.cat([head.logits[0, len(ids) - 1 :], tail.logits[0]]).float().cpu()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(out)), torch.tensor(out)]
    assert result.logprobs == pytest.approx(expected.tolist(), abs=1e-3)


async def test_a_weight_update_clears_the_prefix_cache(engine: EmbeddedEngine) -> None:
    early = engine.model.state_dict()[EARLY].clone()
    first_ids = prompt(engine, "Name a fruit that grows on trees in Brazil.")
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=12)
    first = await engine.generate(first_ids, sampling, "before-update")
    assert len(engine.prefix_cache) > 0
    second_ids = next_turn(engine, first_ids, first)
    changed = {**engine.model.state_dict(), EARLY: perturbed(early)}
    try:
        await engine.update_weights(changed, engine.policy_version + 1)
        assert len(engine.prefix_cache) == 0
        saved = engine.prefix_tokens_saved
        second = await engine.generate(second_ids, sampling, "after-update")
        assert engine.prefix_tokens_saved == saved  # turn one's KV is the old weights'
        assert second.logprobs == pytest.approx(
            reference_logprobs(engine, second_ids, second.output_ids), abs=1e-3
        )
    finally:
        restored = {**engine.model.state_dict(), EARLY: early}
        await engine.update_weights(restored, engine.policy_version + 1)


async def test_abort_ends_running_generations_and_queued_ones_wait_for_resume(
    engine: EmbeddedEngine,
) -> None:
    ids = prompt(engine, "Write a very long essay about the sea.")
    await engine.pause("drain")  # queue three at once: two fill a batch, one waits
    running = [asyncio.create_task(engine.generate(ids, LONG, f"run-{i}")) for i in range(2)]
    queued = asyncio.create_task(engine.generate(ids, SHORT, "queued"))
    await engine.resume()
    await wait_for_tokens(engine, "run-0", 2)
    await engine.pause("abort")
    done, _ = await asyncio.wait(running, timeout=5)
    assert len(done) == 2
    for task in running:
        result = task.result()
        assert result.finish_reason == "abort" and 0 < len(result.output_ids) < 200
        assert result.policy_versions == [engine.policy_version] * len(result.output_ids)
    late = asyncio.create_task(engine.generate(ids, SHORT, "late"))
    cancelled = asyncio.create_task(engine.generate(ids, SHORT, "cancelled-while-paused"))
    await asyncio.sleep(0)  # both reach the queue
    await engine.abort("cancelled-while-paused")  # abort still answers while paused
    assert (await cancelled).finish_reason == "abort"
    done, _ = await asyncio.wait([queued, late], timeout=0.3)
    assert not done  # paused: they wait, they are not refused
    await engine.resume()
    for result in await asyncio.gather(queued, late):
        assert result.finish_reason == "length" and len(result.output_ids) == 4
    assert not engine._active


async def test_drain_finishes_running_generations_and_holds_new_ones(
    engine: EmbeddedEngine, original: torch.Tensor
) -> None:
    ids = prompt(engine, "Write a very long essay about the sea.")
    old, new = engine.policy_version, engine.policy_version + 1
    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=8)
    first = asyncio.create_task(engine.generate(ids, sampling, "draining"))
    await wait_for_tokens(engine, "draining", 1)
    pausing = asyncio.create_task(engine.pause("drain"))
    later = asyncio.create_task(engine.generate(ids, SHORT, "after-drain"))
    await pausing
    drained = await first
    assert drained.finish_reason == "length" and len(drained.output_ids) == 12
    assert drained.policy_versions == [old] * 12
    await engine.update_weights(with_weight(engine, perturbed(original)), new)
    assert not later.done()
    await engine.resume()
    result = await later
    assert result.policy_versions == [new] * 4
    assert result.logprobs == pytest.approx(
        reference_logprobs(engine, ids, result.output_ids), abs=1e-3
    )


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin"])
async def test_a_checkpoint_folder_is_loaded_in_place(
    engine: EmbeddedEngine, original: torch.Tensor, tmp_path, layout: str
) -> None:
    weight = perturbed(original, seed=2)
    state = with_weight(engine, weight)
    if layout == "bin":
        torch.save({k: v.clone() for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    else:  # save_pretrained drops lm_head.weight, tied to the embeddings
        shard = "100MB" if layout == "sharded" else "5GB"
        engine.model.save_pretrained(tmp_path, state_dict=state, max_shard_size=shard)
    parameters = {id(p) for p in engine.model.parameters()}
    await engine.update_weights(tmp_path, engine.policy_version + 1)
    assert {id(p) for p in engine.model.parameters()} == parameters  # the same module
    assert torch.equal(current(engine), weight)
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    ids = prompt(engine, "Hi")
    result = await engine.generate(ids, SamplingParams(max_tokens=4, seed=4), f"folder-{layout}")
    assert result.logprobs == pytest.approx(
        reference_logprobs(engine, ids, result.output_ids), abs=1e-3
    )


async def test_the_caller_changing_its_tensors_later_leaves_the_engine_alone(
    engine: EmbeddedEngine, original: torch.Tensor
) -> None:
    mine = perturbed(original, seed=3)
    await engine.update_weights(with_weight(engine, mine), engine.policy_version + 1)
    loaded = mine.clone()
    mine.add_(1.0)  # what an optimizer step does to the trainer's tensors
    assert torch.equal(current(engine), loaded)


def bad_sources(engine: EmbeddedEngine, original: torch.Tensor) -> dict[str, tuple[object, str]]:
    """Sources each refused with the key it names; each also carries a good changed tensor."""
    good = with_weight(engine, perturbed(original, seed=4))
    short = {**good, "model.norm.weight": torch.ones(3)}
    missing = {k: v for k, v in good.items() if k != "model.layers.3.self_attn.q_proj.weight"}
    extra = {**good, "model.layers.99.mlp.up_proj.weight": torch.ones(2)}
    embed = good["model.embed_tokens.weight"]
    untied = {**good, "model.embed_tokens.weight": embed + 1.0, "lm_head.weight": embed}
    return {
        "wrong shape": (short, "model.norm.weight"),
        "missing key": (missing, "model.layers.3.self_attn.q_proj.weight"),
        "unknown key": (extra, "model.layers.99.mlp.up_proj.weight"),
        "tied weights differ": (untied, "lm_head.weight"),
    }


@pytest.mark.parametrize(
    "case", ["wrong shape", "missing key", "unknown key", "tied weights differ"]
)
async def test_a_bad_state_dict_is_refused_and_the_old_weights_stay(
    engine: EmbeddedEngine, original: torch.Tensor, case: str
) -> None:
    source, key = bad_sources(engine, original)[case]
    version, before = engine.policy_version, current(engine).clone()
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        await engine.update_weights(source, version + 1)
    assert engine.policy_version == version
    assert torch.equal(current(engine), before)
    result = await engine.generate(prompt(engine, "Hi"), SHORT, f"after-{case}")
    assert result.policy_versions == [version] * len(result.output_ids)


async def test_versions_must_increase_and_a_folder_must_hold_weights(
    engine: EmbeddedEngine, original: torch.Tensor, tmp_path
) -> None:
    version = engine.policy_version
    with pytest.raises(ConfigError, match="does not follow"):
        await engine.update_weights(with_weight(engine, original), version)
    with pytest.raises(ConfigError, match=r"holds no model\.safetensors"):
        await engine.update_weights(tmp_path, version + 1)
    assert engine.policy_version == version


async def test_closing_while_paused_answers_frozen_and_queued_requests(
    engine: EmbeddedEngine,
) -> None:
    # A second engine over the same (idle) model: this one is closed here.
    other = EmbeddedEngine(engine.model, engine.tokenizer, device=engine.device)
    ids = prompt(engine, "Write a very long essay about the sea.")
    frozen = asyncio.create_task(other.generate(ids, LONG, "frozen"))
    await wait_for_tokens(other, "frozen", 1)
    await other.pause("keep")
    queued = asyncio.create_task(other.generate(ids, SHORT, "queued"))
    await asyncio.sleep(0)  # it reaches the queue
    await asyncio.wait_for(other.close(), timeout=10)
    for result in await asyncio.gather(frozen, queued):
        assert result.finish_reason == "abort"
    with pytest.raises(EngineError, match="closed"):
        await other.generate(ids, SHORT, "after-close")


async def test_a_tensor_that_cannot_be_copied_changes_no_weight(engine: EmbeddedEngine) -> None:
    # Shapes and dtypes fit, but one tensor holds no data (meta): staged before any write.
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    state = {k: v + 1.0 for k, v in before.items()}
    last = list(state)[-1]
    state[last] = torch.empty_like(state[last], device="meta")
    with pytest.raises(ConfigError, match=f"{last!r} cannot be read"):
        await engine.update_weights(state, engine.policy_version + 1)
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ConfigError, match="not int"):
        await engine.update_weights(5, engine.policy_version + 1)  # type: ignore[arg-type]
