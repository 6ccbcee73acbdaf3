"""What is recorded and exported does not depend on how the gateway holds ids in flight: a
fixed, seeded run (retries after engine failures, concurrent branches, a stream closed early)
gives byte for byte the trajectories and sample rows of ``fixed_run/run.jsonl``. Commit fa584dd
made them, when the tip and the turns each held the context; they were made again once a
request could extend any thread's tip (the branch that goes on second now extends its own
segment: 3 samples -> 2) and trajectories counted their conversations, and the linear
rollout's sample row stayed as it was."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.fixed_run.make_run import run_bytes

RECORDED = Path(__file__).parent / "fixed_run" / "run.jsonl"


async def test_a_fixed_runs_records_and_samples_are_byte_identical_to_the_base_commits() -> None:
    got = await run_bytes()
    want = RECORDED.read_bytes()
    assert got.count(b"\n") == want.count(b"\n") == 5  # 2 trajectories, 1 + 2 sample rows
    for line, (got_line, want_line) in enumerate(
        zip(got.splitlines(), want.splitlines(), strict=True)
    ):
        assert got_line == want_line, f"line {line} differs"
