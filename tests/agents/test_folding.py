"""Context folding: an agent whose conversation outgrows the model's context runs to the end
only with it; each fold starts an exact segment; the export has one sample per segment, tied
to its rollout and group; a summary is a recorded model call."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rollway import RolloutClient
from rollway.agents import AgentLoop, RolloutContext
from rollway.agents.folding import (
    ContextFolding,
    DropToolOutputs,
    FitCheck,
    Footprint,
    KeepLastTurns,
    SummarizeOlder,
    split_history,
)
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord
from rollway.store.export import sample_rows
from rollway.trajectory_format import check_prompt_hashes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.long_context.agent import LogReaderAgent, check_answer, log_chunk  # noqa: E402

CONTEXT = 512


def short_context_gateway(renderer: ChatRenderer) -> Gateway:
    """The sim engine behind a gateway that knows a 512-token context, as a capped model's."""
    engine = SimEngine(SimConfig(output_len=6))
    return Gateway(engine, renderer, model_name="sim", context_length=CONTEXT)


def run(
    agent: AgentLoop, gateway: Gateway, tmp_path: Path, tasks: list[dict[str, Any]]
) -> list[RolloutRecord]:
    with RolloutClient(agent, gateway, store=str(tmp_path), seed=1) as client:
        return [item.result for item in client.run_batch(tasks, group_size=2)]


TASK = {"task_id": "log-0", "seed": 0, "chunks": 14, "code_at": 12, "code": "4821"}


def test_the_example_runs_past_the_context_only_with_folding(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = short_context_gateway(renderer)
    log = "\n".join(log_chunk(TASK, i) for i in range(TASK["chunks"]))
    assert len(renderer.tokenizer(log)["input_ids"]) > 2 * CONTEXT  # it does outgrow it
    unfolded = run(LogReaderAgent(), gateway, tmp_path / "a", [{**TASK, "fold": False}])
    assert {r.status for r in unfolded} == {"error"}
    assert all("context" in (r.reason or "") for r in unfolded), unfolded[0]

    folded = run(LogReaderAgent(), gateway, tmp_path / "b", [TASK])
    for record in folded:
        assert record.status == "completed", record.reason
        trajectory = record.trajectory
        assert trajectory is not None and trajectory.segment_count >= 3
        assert check_prompt_hashes(trajectory.turns) == []
        # Every call fitted the context, and every sample is exact within itself.
        assert all(t.prompt_len + len(t.completion_ids) <= CONTEXT for t in trajectory.turns)
        for sample in trajectory.samples:
            turns = [t for t in trajectory.turns if t.segment == sample.segment]
            last = turns[-1]
            whole = trajectory.prompt_ids(last.index) + last.completion_ids
            assert sample.prompt_ids + sample.response_ids == whole
            assert sum(sample.loss_mask) == sum(len(t.completion_ids) for t in turns)
    rows = list(sample_rows(folded))
    segments = sum(r.trajectory.segment_count for r in folded)  # type: ignore[union-attr]
    assert len(rows) == segments
    by_rollout = {(row["rollout_id"], row["group_id"]) for row in rows}
    assert by_rollout == {(r.rollout_id, r.group_id) for r in folded}
    assert {row["reward"] for row in rows} <= {0.0, 1.0}


class Summarizing(AgentLoop):
    name = "summarizing"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        folding = ContextFolding(300, [SummarizeOlder(keep_last=1, max_tokens=6)])
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the log."}]
        for index in range(8):
            messages.append({"role": "user", "content": log_chunk(TASK, index)})
            reply = await folding.chat(ctx, messages, max_tokens=6)
            messages.append(reply.message)
        return ctx.complete(messages, reward=float(folding.folds))


def test_a_summary_is_a_recorded_model_call_and_replaces_the_older_turns(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    record = run(Summarizing(), short_context_gateway(renderer), tmp_path, [{"task_id": "s"}])[0]
    assert record.status == "completed", record.reason
    folds = int(record.reward or 0)
    assert folds >= 2
    trajectory = record.trajectory
    assert trajectory is not None
    asks = [t for t in trajectory.turns if "Summarize the earlier steps" in _prompt_text(
        renderer, trajectory.prompt_ids(t.index))]  # fmt: skip
    assert len(asks) == folds  # one summary call per fold, each recorded as a turn
    assert any(m["content"].startswith("Summary of the earlier steps") for m in record.messages
               if m["role"] == "user")  # fmt: skip


def _prompt_text(renderer: ChatRenderer, ids: list[int]) -> str:
    return renderer.decode(ids)


def test_history_splits_at_assistant_messages_so_calls_keep_their_results() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 500},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "more"},
    ]
    head, exchanges = split_history(messages)
    assert head == messages[:2]
    assert exchanges == [messages[2:4], messages[4:]]


async def test_keep_last_turns_and_drop_tool_outputs_fold_to_the_budget() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for i in range(6):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{**call, "id": f"c{i}"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "y" * 900},
        ]
    fits = FitCheck(Footprint(chars_per_token=3.0), budget=700)
    assert not fits(messages)
    dropped = await DropToolOutputs(keep_last=1).fold(None, messages, fits)  # type: ignore[arg-type]
    assert fits(dropped) and dropped[-1] == messages[-1]  # the newest result stays whole
    assert dropped[2]["content"] == "[tool output of 900 characters dropped]"
    assert [m.get("tool_call_id") for m in dropped] == [m.get("tool_call_id") for m in messages]
    kept = await KeepLastTurns(3).fold(None, messages, fits)  # type: ignore[arg-type]
    exchanges = (len(kept) - 2) // 2  # the task, the note, then whole call-result pairs
    assert 1 <= exchanges < 3 and fits(kept)  # fewer than asked where three do not fit
    dropped_count = len(messages) - 1 - 2 * exchanges
    note = {"role": "user", "content": f"[{dropped_count} earlier messages were folded away.]"}
    assert kept == [messages[0], note, *messages[-2 * exchanges :]]


def test_folding_refuses_a_budget_that_is_not_one() -> None:
    with pytest.raises(ConfigError, match="budget"):
        ContextFolding(0)
    with pytest.raises(ConfigError, match="policy"):
        ContextFolding(100, [])


def test_the_examples_answer_check_reads_the_code() -> None:
    assert check_answer(TASK, "the code is 4821") and not check_answer(TASK, "4822")


async def test_a_summary_with_no_room_to_ask_folds_nothing_and_lets_the_next_policy_fold() -> None:
    head = [{"role": "system", "content": "s " * 600}, {"role": "user", "content": "task"}]
    exchange = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "x" * 300}]
    messages = head + exchange * 4
    fits = FitCheck(Footprint(chars_per_token=3.0), budget=250)  # the head alone is ~400
    summarize = SummarizeOlder(keep_last=1, max_tokens=16)
    assert await summarize.fold(None, messages, fits) is messages  # type: ignore[arg-type]


class ShortOutputs(AgentLoop):
    """Tool results too short to drop: DropToolOutputs alone cannot fold them."""

    name = "short-outputs"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        folding = ContextFolding(120, [DropToolOutputs(keep_last=0)])
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
        for i in range(6):
            reply = await folding.chat(ctx, messages, max_tokens=4)
            messages += [reply.message, {"role": "user", "content": f"step {i} " * 8}]
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c", "content": "ok"}]  # fmt: skip
        return ctx.complete(messages, reward=float(folding.folds))


def test_a_fold_that_changes_nothing_is_not_counted_and_is_logged(
    renderer: ChatRenderer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = Gateway(SimEngine(SimConfig(output_len=4)), renderer, model_name="sim")
    with caplog.at_level("WARNING", logger="rollway.agents.folding"):
        record = run(ShortOutputs(), gateway, tmp_path, [{"task_id": "s"}])[0]
    assert record.status == "completed", record.reason
    assert record.reward == 0.0  # no fold counted
    assert any("over its budget" in message for message in caplog.messages)
