"""10,000 rollouts: the listing pages over the index and never reads a trajectory; a page
costs about as much as loading a handful of records, not all of them."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from rollway.results import RolloutRecord
from rollway.store import FileStore, index_row
from rollway.trajectory import Trajectory
from rollway.viewer import RunIndex, create_viewer_app, open_run
from tests.trajectories import chain

N = 10_000
GROUP = 8


@functools.cache
def trajectory(second_turn_tokens: int) -> Trajectory:
    """A two-turn rollout (glue between the turns) with a short prompt, as the gateway would
    record it: a few kilobytes (a real one is tens)."""
    prompt = list(range(1000, 1200))
    first = dict(index=0, segment=0, request_id="r.0", prompt_ids=prompt,
                 completion_ids=[7, 8, 9, 10], logprobs=[-0.1, -0.2, -0.3, -1.0],
                 finish_reason="stop", content="x", sampling={}, latency_ms=5.0,
                 prompt_hash="0" * 16)  # fmt: skip
    second = first | {
        "index": 1, "prompt_ids": [*prompt, 7, 8, 9, 10, 2, 3],
        "completion_ids": [11] * second_turn_tokens,
        "logprobs": [-0.5] * second_turn_tokens}  # fmt: skip
    turns = chain([first, second])
    return Trajectory(
        rollout_id="exp.t.0.1", model="m", sampling={}, max_turns=None, max_seq_len=None,
        messages=[{"role": "user", "content": "a task"}], tools=None, turns=turns,
        is_truncated=False, truncation_reason=None,
        is_cancelled=False, segment_count=1, drift=None,
    )  # fmt: skip


def small_record(i: int) -> RolloutRecord:
    """Rollout ``i``: groups of GROUP, one in ten an agent error, rewards 0, 0.5 and 1."""
    failed = i % 10 == 0
    task, sample = divmod(i, GROUP)
    return RolloutRecord(
        exp_id="exp", rollout_key=f"t{task:05d}.{sample}", rollout_id=f"exp.t{task:05d}.{sample}.1",
        task_index=task, group_id=f"exp:t{task:05d}", group_index=task, sample_index=sample,
        status="error" if failed else "completed", error_kind="agent" if failed else None,
        reason=f"bad luck {i}" if failed else None, reward=None if failed else (i % 3) / 2,
        started_at=1e9 + i, elapsed_s=(i % 97) / 10, trajectory=trajectory(i % 7 + 1),
    )  # fmt: skip


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What FileStore.write leaves (a record file each, an index line each), written in bulk:
    10,000 locked, synced, renamed writes would take most of the test's time."""
    store = FileStore(tmp_path_factory.mktemp("big"), "exp")
    lines = []
    for i in range(N):
        record = small_record(i)
        path = store.path / "trajectories" / f"{record.rollout_key}.json"
        path.write_bytes(record.model_dump_json().encode())
        written = path.stat()
        row = {**index_row(record), "bytes": written.st_size, "mtime_ns": written.st_mtime_ns}
        lines.append(orjson.dumps(row))
    (store.path / "index.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return store.path


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts records parsed (every read of a record goes through model_validate_json)."""
    count = [0]
    original = RolloutRecord.model_validate_json.__func__  # type: ignore[attr-defined]

    def counting(cls, *args, **kwargs):
        count[0] += 1
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(RolloutRecord, "model_validate_json", classmethod(counting))
    yield count


def timed(call) -> float:
    """The CPU the call costs this process (the viewer's thread included): wall time on a
    loaded machine measures the other processes too (a page once took 4x every record's
    load that way, in a suite beside seven others)."""
    started = time.process_time()
    call()
    return time.process_time() - started


def test_a_page_of_10000_costs_a_few_record_loads_and_reads_no_record(
    big_run: Path, parses: list[int]
) -> None:
    location = open_run(str(big_run))
    index = RunIndex(location)
    store = location.store
    keys = sorted(store.keys())
    assert len(keys) == N
    one_record = statistics.median(timed(lambda k=k: store.get(k)) for k in keys[:: N // 40])
    parses[0] = 0
    with TestClient(create_viewer_app(location, index=index)) as client:

        def page(**params: object) -> dict:
            answer = client.get("/api/rollouts", params={"limit": 50, **params})
            assert answer.status_code == 200
            return answer.json()

        first = timed(lambda: page())  # reads the index: one file, not 10,000
        assert first < N * one_record  # less than loading every record would cost
        sort = {"sort": "reward", "order": "desc", "status": "completed"}
        filtered = timed(lambda: page(**sort))  # a new order and filter over all rows
        assert filtered < 0.1 * N * one_record
        warm = min(timed(lambda o=o: page(offset=o, **sort)) for o in range(100, 1100, 100))
        assert warm < 100 * one_record  # another page of the same listing: a slice
        completed = N - N // 10
        rows = page(offset=completed - 60, **sort)
        assert rows["matched"] == completed and len(rows["rows"]) == 50
        rewards = [r["reward"] for r in page(offset=0, **sort)["rows"]]
        assert rewards == [1.0] * 50
        groups = client.get("/api/groups", params={"sort": "mean_reward", "order": "desc"})
        assert groups.json()["total"] == N // GROUP
        totals = client.get("/api/run").json()["totals"]
        assert totals["rollouts"] == N and totals["by_status"]["error"] == N // 10
    assert parses[0] == 0 and index.records_read == 0
