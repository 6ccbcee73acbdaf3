"""The export carries each token's policy version, the sample's staleness and its logprob kind,
and drops samples staler than asked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rollway.cli.main import app
from rollway.errors import BadRecordError
from rollway.generation import LogprobKind
from rollway.results import RolloutRecord
from rollway.store import FileStore, export_records
from rollway.store.export import sample_rows
from rollway.trajectory import StepDistribution, Trajectory, build_samples
from tests.trajectories import chain


def turn(index: int, prompt: list[int], completion: list[int], versions: list[int] | None,
         kind: LogprobKind = "raw_logprobs") -> dict[str, Any]:  # fmt: skip
    return dict(
        index=index, segment=0, request_id=f"r-{index + 1}", prompt_ids=prompt,
        completion_ids=completion, logprobs=[-0.5] * len(completion), finish_reason="stop",
        content="", sampling={}, latency_ms=1.0, prompt_hash="0", policy_versions=versions,
        logprob_kind=kind,
    )  # fmt: skip


def record(key: str, whole: list[dict[str, Any]]) -> RolloutRecord:
    turns = chain(whole)
    trajectory = Trajectory(
        rollout_id=f"e.{key}.1", model="m", sampling={}, max_turns=None, max_seq_len=None,
        messages=[], tools=None, turns=turns, is_truncated=False,
        truncation_reason=None, is_cancelled=False, segment_count=1, drift=None,
    )  # fmt: skip
    return RolloutRecord(
        exp_id="e", rollout_key=key, rollout_id=f"e.{key}.1", task_index=0, group_id="e:t",
        group_index=0, sample_index=0, status="completed", reward=1.0, started_at=time.time(),
        elapsed_s=0.1, trajectory=trajectory,
        policy_version=trajectory.oldest_policy_version(),
    )  # fmt: skip


RECORDS = [
    # Two turns across an update: versions 1 then 2, glue between them.
    record("span.0", [turn(0, [1, 2], [3, 4], [1, 1]), turn(1, [1, 2, 3, 4, 9], [5], [2])]),
    record("old.0", [turn(0, [1, 2], [3], [0])]),
    record("new.0", [turn(0, [1, 2], [3], [3])]),
    record("mixed.0", [turn(0, [1], [2], [3]), turn(1, [1, 2, 7], [4], [3], "processed_logprobs")]),
    record("none.0", [turn(0, [1], [2], None)]),
]


def test_rows_carry_versions_staleness_and_kind(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    assert export_records(RECORDS, path, "parquet") == 5
    rows = {row["rollout_key"]: row for row in pq.read_table(path).to_pylist()}
    span = rows["span.0"]
    assert span["response_ids"] == [3, 4, 9, 5] and span["loss_mask"] == [1, 1, 0, 1]
    assert span["policy_versions"] == [1, 1, -1, 2]
    assert (span["policy_version"], span["staleness"]) == (1, 2)  # the newest seen is 3
    assert (rows["old.0"]["staleness"], rows["new.0"]["staleness"]) == (3, 0)
    assert rows["mixed.0"]["logprob_kind"] == "mixed" and span["logprob_kind"] == "raw_logprobs"
    none = rows["none.0"]
    assert none["policy_versions"] is None and none["staleness"] is None
    assert (span["policy_version_max"], none["policy_version_max"]) == (2, None)


def test_rows_carry_the_opening_messages_and_the_rewards_components(tmp_path: Path) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    messages = [*opening, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "4"},
                {"role": "assistant", "content": "4"}]  # fmt: skip
    info = {"source": "reward_fn", "correct": 1.0, "format": 0.5}
    scored = RECORDS[0].model_copy(update={"messages": messages, "reward_info": info})
    for fmt in ("parquet", "jsonl"):
        path = tmp_path / f"rows.{fmt}"
        export_records([scored, RECORDS[1]], path, fmt)  # type: ignore[arg-type]
        if fmt == "parquet":
            rows = pq.read_table(path).to_pylist()
        else:
            rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        first, other = rows
        assert orjson.loads(first["prompt_messages"]) == opening
        assert orjson.loads(first["reward_info"]) == info
        assert orjson.loads(other["prompt_messages"]) == [] and other["reward_info"] == "{}"


def test_max_staleness_drops_what_is_too_old(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert export_records(RECORDS, path, "jsonl", max_staleness=1) == 3  # not span, not old
    assert export_records(RECORDS, path, "jsonl", max_staleness=2, latest_version=3) == 4
    store = FileStore(tmp_path / "runs", "e")
    for item in RECORDS:
        store.write(item)
    out = tmp_path / "cli.parquet"
    result = CliRunner().invoke(
        app, ["export", str(tmp_path / "runs" / "e"), "--output", str(out), "--max-staleness", "0"]
    )
    assert result.exit_code == 0, result.output
    kept = sorted(r["rollout_key"] for r in pq.read_table(out).to_pylist())
    assert kept == ["mixed.0", "new.0", "none.0"]


def test_versions_past_32_bits_export_to_parquet(tmp_path: Path) -> None:
    big = 2**40
    path = tmp_path / "big.parquet"
    assert export_records([record("big.0", [turn(0, [1], [2], [big])])], path, "parquet") == 1
    (row,) = pq.read_table(path).to_pylist()
    assert row["policy_versions"] == [big] and row["policy_version"] == big


def test_a_latest_version_older_than_the_records_is_refused(tmp_path: Path) -> None:
    from rollway.errors import ConfigError

    with pytest.raises(ConfigError, match="latest version 2 is older than version 3"):
        export_records(RECORDS, tmp_path / "x.jsonl", "jsonl", latest_version=2)


def test_rows_carry_the_agents_finish_reason(tmp_path: Path) -> None:
    capped = record("capped.0", [turn(0, [1], [2], None)])
    capped = capped.model_copy(update={"finish_reason": "max_steps"})
    records = [capped, record("plain.0", [turn(0, [1], [2], None)])]
    parquet, jsonl = tmp_path / "rows.parquet", tmp_path / "rows.jsonl"
    assert export_records(records, parquet, "parquet") == export_records(records, jsonl, "jsonl")
    from_parquet = {
        r["rollout_key"]: r["finish_reason"] for r in pq.read_table(parquet).to_pylist()
    }
    from_jsonl = {
        row["rollout_key"]: row["finish_reason"]
        for row in map(orjson.loads, jsonl.read_bytes().splitlines())
    }
    assert from_parquet == from_jsonl == {"capped.0": "max_steps", "plain.0": None}


def test_rows_carry_raw_logprobs_kept_mass_and_sampling(tmp_path: Path) -> None:
    # Turn 0 sampled at 0.7 under top-p (processed logprobs, raw ones beside, a mass kept);
    # turn 1 at temperature 1 with nothing cut: its raw logprobs are its logprobs.
    scaled = turn(0, [1, 2], [3, 4], [1, 1], "processed_logprobs") | {
        "raw_logprobs": [-0.7, -0.8], "kept_mass": [0.9, 0.95],
        "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 0},
    }  # fmt: skip
    plain = turn(1, [1, 2, 3, 4, 9], [5], [1])
    task = {"task_id": "t-7", "question": "?"}
    rec = record("tis.0", [scaled, plain]).model_copy(update={"task": task})
    path = tmp_path / "rows.parquet"
    assert export_records([rec], path, "parquet") == 1
    (row,) = pq.read_table(path).to_pylist()
    assert row["logprobs"] == [-0.5, -0.5, 0.0, -0.5]
    assert row["raw_logprobs"] == [-0.7, -0.8, 0.0, -0.5]
    assert row["kept_mass"] == [0.9, 0.95, 1.0, 1.0]
    assert (row["temperature"], row["top_p"], row["top_k"]) == (0.7, 0.9, 0)
    assert (row["turns"], row["task_id"], row["logprob_kind"]) == (2, "t-7", "mixed")


def test_a_scaled_turn_without_raw_logprobs_leaves_the_sample_without_them() -> None:
    # SGLang at T != 1 gives processed logprobs only: no raw column is made up.
    (sample,) = build_samples(chain([turn(0, [1], [2, 3], None, "processed_logprobs")]))
    assert sample.raw_logprobs is None and sample.kept_mass is None


def test_flat_groups_are_dropped_when_asked_and_counted(tmp_path: Path) -> None:
    def member(key: str, group: str, reward: float | None) -> RolloutRecord:
        return record(key, [turn(0, [1], [2], None)]).model_copy(
            update={"group_id": group, "reward": reward}
        )

    records = [
        member("a.0", "e:a", 1.0), member("a.1", "e:a", 0.0),  # signal
        member("b.0", "e:b", 0.5), member("b.1", "e:b", 0.5),  # all equal
        member("c.0", "e:c", 1.0), member("c.1", "e:c", None),  # one scored
        member("d.0", "e:d", 1.0), member("d.1", "e:d", None), member("d.2", "e:d", 0.0),
    ]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    assert export_records(records, path, "jsonl") == 9
    assert export_records(records, path, "jsonl", drop_flat_groups=True) == 5
    kept = [orjson.loads(line)["rollout_key"] for line in path.read_bytes().splitlines()]
    assert kept == ["a.0", "a.1", "d.0", "d.1", "d.2"]
    store = FileStore(tmp_path / "runs", "e")
    for item in records:
        store.write(item)
    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(
        app, ["export", str(tmp_path / "runs" / "e"), "--format", "jsonl", "--output", str(out),
              "--drop-flat-groups"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote 5 rows" in result.output and "2 flat groups dropped" in result.output


def test_an_integer_past_64_bits_in_the_reward_info_or_messages_is_exported_exactly(
    tmp_path: Path,
) -> None:
    """orjson refuses such integers; a task or a reward's components may hold them."""
    huge = 2**70
    messages = [{"role": "user", "content": [{"type": "text", "text": "x", "n": huge}]}]
    record = RECORDS[0].model_copy(
        update={"reward_info": {"expected": huge, "nan": float("nan")}, "messages": messages}
    )
    for fmt in ("jsonl", "parquet"):
        path = tmp_path / f"rows.{fmt}"
        assert export_records([record], path, fmt) == 1  # type: ignore[arg-type]
    (row,) = list(sample_rows([record]))
    assert orjson.loads(row["reward_info"].replace(str(huge), "0")) == {"expected": 0, "nan": None}
    assert str(huge) in row["reward_info"] and str(huge) in row["prompt_messages"]


def test_rows_carry_top_logprobs_and_entropy_aligned_with_the_response(tmp_path: Path) -> None:
    # Turn 0 recorded top ids and entropy; turn 1 (another request) did not: its tokens get
    # the blanks, as the glue between them does.
    asked = turn(0, [1, 2], [3, 4], [1, 1]) | {"distribution": {
        "top_ids": [[3, 7], [4, 8]], "top_logprobs": [[-0.1, -2.5], [-0.2, -1.9]],
        "entropy": [0.4, 0.7],
    }}  # fmt: skip
    rec = record("top.0", [asked, turn(1, [1, 2, 3, 4, 9], [5], [1])])
    path = tmp_path / "rows.parquet"
    assert export_records([rec], path, "parquet") == 1
    (row,) = pq.read_table(path).to_pylist()
    assert row["response_ids"] == [3, 4, 9, 5] and row["loss_mask"] == [1, 1, 0, 1]
    assert row["top_ids"] == [[3, 7], [4, 8], [], []]
    assert row["top_logprobs"] == [[-0.1, -2.5], [-0.2, -1.9], [], []]
    assert row["entropy"] == [0.4, 0.7, 0.0, 0.0]
    (plain,) = sample_rows([record("plain.0", [turn(0, [1], [2], None)])])
    assert plain["top_ids"] is None and plain["entropy"] is None


def misaligned(key: str, changes: dict[str, Any], at: int = 0) -> RolloutRecord:
    """A two-turn record whose turn ``at`` has ``changes``: the record as edited by hand."""
    good = record(key, [turn(0, [1, 2], list(range(10, 58)), [0] * 48),
                        turn(1, [1, 2, *range(10, 58), 9], [5], [0])])  # fmt: skip
    assert good.trajectory is not None
    turns = list(good.trajectory.turns)
    turns[at] = turns[at].model_copy(update=changes)
    trajectory = good.trajectory.model_copy(update={"turns": turns})
    return good.model_copy(update={"trajectory": trajectory})


MISALIGNED = {
    "turn 0: 40 logprobs for 48 completion ids": misaligned("short", {"logprobs": [-0.5] * 40}),
    "turn 0: 47 policy_versions for 48 completion ids": misaligned(
        "versions", {"policy_versions": [0] * 47}),
    "turn 0: 3 entropy for 48 completion ids": misaligned(
        "entropy", {"distribution": StepDistribution(entropy=[0.1] * 3)}),
    "turn 0: its top_logprobs are not one per top id": misaligned(
        "top", {"distribution": StepDistribution(top_ids=[[1, 2]] * 48,
                                                 top_logprobs=[[-0.1]] * 48)}),
    "turn 1: prompt does not match its prompt_hash": misaligned(
        "chain", {"new_prompt_ids": [8]}, at=1),
    "turn 0: a completion id outside 0 to 2**31 - 1": misaligned(
        "huge", {"completion_ids": [2**40] * 48}),
}  # fmt: skip


@pytest.mark.parametrize("problem", MISALIGNED)
def test_samples_refuse_a_misaligned_record_naming_the_rollout_and_the_turn(problem: str) -> None:
    bad = MISALIGNED[problem]
    assert bad.trajectory is not None
    with pytest.raises(BadRecordError) as refused:
        bad.trajectory.samples  # noqa: B018
    assert str(refused.value) == f"rollout {bad.rollout_id}: {problem}"


def test_export_skips_and_names_misaligned_records(tmp_path: Path) -> None:
    good = record("good.0", [turn(0, [1, 2], [3, 4], [0, 0])])
    bad: list[BadRecordError] = []
    path = tmp_path / "rows.parquet"
    assert export_records([good, *MISALIGNED.values()], path, "parquet", on_bad=bad.append) == 1
    assert [row["rollout_key"] for row in pq.read_table(path).to_pylist()] == ["good.0"]
    assert [(error.key, error.reason) for error in bad] == [
        (record.rollout_key, problem) for problem, record in MISALIGNED.items()
    ]
    with pytest.raises(BadRecordError, match=r"record short \(rollout e\.short\.1\): turn 0: 40"):
        export_records([good, MISALIGNED["turn 0: 40 logprobs for 48 completion ids"]], path,
                       "parquet")  # fmt: skip
    store = FileStore(tmp_path / "runs", "e")
    for item in [good, *MISALIGNED.values()]:
        store.write(item)
    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(
        app, ["export", str(store.path), "--format", "jsonl", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 1 rows" in result.stdout and "6 bad records skipped" in result.stdout
    assert "warning: skipped record chain (rollout e.chain.1): turn 1: prompt does not match" in (
        result.stderr
    )


def truncated(key: str, reason: str | None, finish: str = "stop") -> RolloutRecord:
    """A record whose trajectory says it was truncated for ``reason`` (None: it was not)."""
    cut = turn(0, [1], [2], None) | {
        "finish_reason": "length" if reason == "max_tokens" else "stop"
    }
    plain = record(key, [cut])
    assert plain.trajectory is not None
    trajectory = plain.trajectory.model_copy(
        update={"is_truncated": reason is not None, "truncation_reason": reason}
    )
    return plain.model_copy(update={"trajectory": trajectory, "finish_reason": finish})


def test_rows_carry_the_rollouts_truncation_in_every_format(tmp_path: Path) -> None:
    records = [
        truncated("cut.0", "max_tokens", finish="length"),
        truncated("turns.0", "max_turns"),
        truncated("whole.0", None),
    ]
    parquet, jsonl = tmp_path / "rows.parquet", tmp_path / "rows.jsonl"
    assert export_records(records, parquet, "parquet") == export_records(records, jsonl, "jsonl")
    columns = ("is_truncated", "truncation_reason", "finish_reason")
    from_parquet = {
        r["rollout_key"]: tuple(r[c] for c in columns) for r in pq.read_table(parquet).to_pylist()
    }
    from_jsonl = {
        row["rollout_key"]: tuple(row[c] for c in columns)
        for row in map(orjson.loads, jsonl.read_bytes().splitlines())
    }
    assert (
        from_parquet
        == from_jsonl
        == {
            "cut.0": (True, "max_tokens", "length"),
            "turns.0": (True, "max_turns", "stop"),
            "whole.0": (False, None, "stop"),
        }
    )
    assert pq.read_schema(parquet).field("is_truncated").type == "bool"


def test_a_record_written_with_a_truncation_but_no_reason_reads_with_one() -> None:
    """Before the reason was always named: a cut turn anywhere, reason null."""
    last_cut = orjson.loads(truncated("a.0", "max_tokens").model_dump_json())
    first_cut = orjson.loads(
        record("b.0", [turn(0, [1], [2], None) | {"finish_reason": "length"},
                       turn(1, [1, 2, 9], [3], None)]).model_dump_json()
    )  # fmt: skip
    for old in (last_cut, first_cut):
        old["trajectory"] |= {"is_truncated": True, "truncation_reason": None}
    read = [RolloutRecord.model_validate(old).trajectory for old in (last_cut, first_cut)]
    assert [(t.is_truncated, t.truncation_reason) for t in read if t] == [
        (True, "max_tokens"),
        (False, None),
    ]
