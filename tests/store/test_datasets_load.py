"""``datasets.load_dataset("parquet", ...)`` reads rollway's Parquet export as it is: typed
columns (lists of ints for ids, floats for logprobs) and every value as exported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.results import AgentResult
from rollway.store import export_records
from rollway.store.export import sample_rows

datasets = pytest.importorskip("datasets")


class TwoTurnAgent(AgentLoop):
    """Two model calls with a user reply between them (mask-0 tokens in the sample)."""

    name = "two-turn-export"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.task["q"]}]
        for _ in range(2):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "more"}]
        return ctx.complete(messages[:-1], reward=ctx.task.get("reward"))


def test_load_dataset_reads_the_parquet_export_typed_and_exact(tmp_path: Path) -> None:
    tasks = [{"q": "hi", "reward": 0.5}, {"q": "again"}]  # the second has no reward: null
    with RolloutClient(TwoTurnAgent, engine="sim", store=str(tmp_path / "runs")) as client:
        assert all(item.success for item in client.run_batch(tasks, group_size=2))
        client.update_weights({})  # the sim engine takes any source
        assert all(item.success for item in client.run_batch([{"q": "later", "reward": 1.0}]))
        records = list(client.store.records())
    path = tmp_path / "rollouts.parquet"
    assert export_records(records, path, "parquet") == 5

    loaded = datasets.load_dataset(
        "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")
    )
    ints = datasets.List(datasets.Value("int32"))
    assert loaded.features["prompt_ids"] == ints and loaded.features["response_ids"] == ints
    assert loaded.features["policy_versions"] == datasets.List(datasets.Value("int64"))
    assert loaded.features["loss_mask"] == datasets.List(datasets.Value("int8"))
    assert loaded.features["logprobs"] == datasets.List(datasets.Value("float64"))
    assert loaded.features["reward"] == datasets.Value("float64")
    assert loaded.features["staleness"] == datasets.Value("int64")
    exported = {row["rollout_id"]: row for row in sample_rows(records)}
    assert {row["rollout_id"]: row for row in loaded} == exported
    # The run's content, not just its shape: glue tokens, two versions, a null reward.
    assert all(0 in row["loss_mask"] and 1 in row["loss_mask"] for row in loaded)
    assert sorted({row["policy_version"] for row in loaded}) == [0, 1]
    assert sorted(row["reward"] is None for row in loaded) == [False] * 3 + [True] * 2
