"""`rollway run`, `validate` and `export` as real subprocesses on the shipped example."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
AGENT = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
TASKS = ROOT / "examples" / "calculator" / "tasks.jsonl"


def rollway(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollway", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_shipped_tasks_have_answers() -> None:
    rows = [orjson.loads(line) for line in TASKS.read_text().splitlines()]
    assert len(rows) >= 20 and all({"task_id", "question", "answer"} <= set(r) for r in rows)


def test_run_then_rerun_then_export(tmp_path: Path) -> None:
    args = ["run", AGENT, "--tasks", str(TASKS), "--limit", "3", "--group-size", "2",
            "--engine", "sim", "--out", str(tmp_path / "runs")]  # fmt: skip
    first = rollway(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    exp = tmp_path / "runs" / "calculator-tasks"
    assert len(list((exp / "trajectories").glob("*.json"))) == 6
    assert "rollway run summary" in first.stderr
    summary = orjson.loads((exp / "summary.json").read_bytes())
    assert summary["total"] == 6 and sum(summary["by_status"].values()) == 6
    config = orjson.loads((exp / "config.json").read_bytes())
    assert config["limits"]["timeout"] == 900.0  # no run hangs forever by default
    groups = orjson.loads((exp / "groups.json").read_bytes())["groups"]
    assert len(groups) == 3
    second = rollway(*args, cwd=tmp_path)
    assert second.returncode == 0
    assert orjson.loads((exp / "summary.json").read_bytes())["total"] == 6
    index_lines = (exp / "index.jsonl").read_text().splitlines()
    assert len(index_lines) == 6  # the rerun resumed: nothing ran again
    exported = rollway("export", str(exp), "--format", "parquet", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    rows = pq.read_table(tmp_path / "calculator-tasks.parquet").to_pylist()
    assert len(rows) == 6 and {r["group_id"] for r in rows} == {g["group_id"] for g in groups}
    assert all(len(r["response_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) for r in rows)


def test_bad_records_are_rerun_by_resume_and_skipped_by_export_each_named(
    tmp_path: Path,
) -> None:
    args = ["run", AGENT, "--tasks", str(TASKS), "--limit", "4", "--engine", "sim",
            "--out", str(tmp_path / "runs")]  # fmt: skip
    assert rollway(*args, cwd=tmp_path).returncode == 0
    trajectories = tmp_path / "runs" / "calculator-tasks" / "trajectories"
    cut, newer, link, _ = sorted(trajectories.glob("*.json"))
    good = orjson.loads(newer.read_bytes())
    cut.write_bytes(cut.read_bytes()[:100])
    newer.write_bytes(orjson.dumps(good | {"trajectory": good["trajectory"] | {
        "format_version": 99}}))  # fmt: skip
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash")
    link.unlink()
    link.symlink_to(secret)
    exported = rollway("export", str(trajectories.parent), "--format", "jsonl", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert "wrote 1 rows" in exported.stdout and "3 bad records skipped" in exported.stdout
    for path, reason in ((cut, "Invalid JSON"), (newer, "trajectory format 99 is newer"),
                         (link, "a symbolic link, which rollway does not follow")):  # fmt: skip
        assert f"warning: skipped {path}: " in exported.stderr and reason in exported.stderr
    assert "secret" not in exported.stderr + exported.stdout
    rerun = rollway(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    for path in (cut, newer, link):
        assert f"running rollout {path.stem} again: {path}: " in rerun.stderr
    summary = orjson.loads((trajectories.parent / "summary.json").read_bytes())
    assert (summary["total"], summary["resumed"], summary["rerun"]) == (4, 1, {"bad record": 3})
    assert "stored, run again: bad record" in rerun.stderr
    assert not link.is_symlink() and secret.read_text() == "root:$6$secret-hash"
    again = rollway("export", str(trajectories.parent), "--format", "jsonl", cwd=tmp_path)
    assert "wrote 4 rows" in again.stdout and "skipped" not in again.stdout + again.stderr


def test_a_rerun_with_another_timeout_runs_again_and_says_why(tmp_path: Path) -> None:
    args = ["run", AGENT, "--tasks", str(TASKS), "--limit", "2", "--engine", "sim",
            "--out", str(tmp_path / "runs")]  # fmt: skip
    assert rollway(*args, cwd=tmp_path).returncode == 0
    longer = rollway(*args, "--timeout", "60", cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr
    why = "settings changed: limits.timeout 900.0 (now 60.0)"
    said = f"resume: 0 of 2 rollouts from the store; 2 stored run again: 2 {why}"
    assert longer.stderr.count(said) == 1, longer.stderr
    exp = tmp_path / "runs" / "calculator-tasks"
    assert orjson.loads((exp / "summary.json").read_bytes())["rerun"] == {why: 2}
    assert len((exp / "index.jsonl").read_text().splitlines()) == 4
    same = rollway(*args, "--timeout", "60", cwd=tmp_path)
    assert same.stderr.count("resume: 2 of 2 rollouts from the store") == 1, same.stderr
    assert len((exp / "index.jsonl").read_text().splitlines()) == 4


def test_the_command_line_reward_wins_over_the_agents_own(tmp_path: Path) -> None:
    """The calculator agent sets its own reward; ``--reward`` asks for the function's."""
    result = rollway(
        "run", AGENT, "--tasks", str(TASKS), "--limit", "2", "--engine", "sim",
        "--reward", f"{ROOT}/examples/calculator/agent.py:reward",
        "--out", str(tmp_path / "runs"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [
        orjson.loads(path.read_bytes())
        for path in (tmp_path / "runs" / "calculator-tasks" / "trajectories").glob("*.json")
    ]
    assert len(records) == 2
    for record in records:
        info = record["reward_info"]
        assert info["source"] == "reward_fn" and "final" in info, info
        assert info["agent_reward"] in (0.0, 1.0), info  # kept beside it, for comparison


def test_validate_reports_ready_and_broken_agents(tmp_path: Path) -> None:
    ok = rollway("validate", AGENT, cwd=tmp_path)
    assert ok.returncode == 0 and "add, subtract, multiply, divide" in ok.stdout
    broken = tmp_path / "broken.py"
    broken.write_text(
        "from rollway.agents import AgentLoop\n"
        "class Broken(AgentLoop):\n"
        "    name = 'broken'\n"
        "    def get_tools(self, task):\n"
        "        return 'add'\n"
        "    async def run(self, ctx):\n"
        "        return ctx.complete([])\n"
    )
    bad = rollway("validate", f"{broken}:Broken", cwd=tmp_path)
    assert bad.returncode == 1
    assert "error TOOLS_NOT_A_LIST get_tools: get_tools returned str, not a list" in bad.stdout


def test_run_names_a_missing_task_file(tmp_path: Path) -> None:
    result = rollway("run", AGENT, "--tasks", "nowhere.jsonl", "--engine", "sim", cwd=tmp_path)
    assert result.returncode == 1 and "no task file nowhere.jsonl" in result.stderr


def test_run_against_a_simulated_sglang_server_process(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "rollway", "sim-server", "--port", str(port), "--output-len", "8"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    with server:
        assert server.stdout is not None and "simulated sglang server" in server.stdout.readline()
        try:
            result = rollway(
                "run", AGENT, "--tasks", str(TASKS), "--limit", "2", "--engine",
                f"sglang://127.0.0.1:{port}", "--out", str(tmp_path), cwd=tmp_path,
            )  # fmt: skip
        finally:
            server.terminate()
    assert result.returncode == 0, result.stderr
    records = [orjson.loads(p.read_bytes()) for p in tmp_path.glob("*/trajectories/*.json")]
    assert len(records) == 2
    assert all(r["trajectory"]["turns"][0]["completion_ids"] for r in records)


def test_run_cmd_runs_any_program_as_the_agent(tmp_path: Path) -> None:
    program = tmp_path / "prog.py"
    program.write_text(
        "import json, os\n"
        "from openai import OpenAI\n"
        "OpenAI().chat.completions.create(model=os.environ['OPENAI_MODEL'],\n"
        "    messages=[{'role': 'user', 'content': 'hi'}])\n"
        "json.dump({'reward': 1.0}, open(os.environ['ROLLWAY_RESULT_FILE'], 'w'))\n"
    )
    result = rollway(
        "run", "--cmd", f"{sys.executable} {program}", "--tasks", str(TASKS), "--limit", "2",
        "--engine", "sim", "--out", str(tmp_path / "runs"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [orjson.loads(p.read_bytes()) for p in tmp_path.glob("runs/*/trajectories/*.json")]
    assert len(records) == 2 and all(r["reward"] == 1.0 for r in records)
    assert all(len(r["trajectory"]["turns"]) == 1 for r in records)


def test_run_wants_exactly_one_of_agent_and_cmd(tmp_path: Path) -> None:
    both = rollway("run", AGENT, "--cmd", "true", "--tasks", str(TASKS), cwd=tmp_path)
    assert both.returncode == 1 and "one of them" in both.stderr


def test_run_writes_every_event_as_a_json_line(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    ran = rollway("run", AGENT, "--tasks", str(TASKS), "--limit", "2", "--group-size", "2",
                  "--engine", "sim", "--out", str(tmp_path / "runs"), "--events", str(events),
                  cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lines = [orjson.loads(line) for line in events.read_text().splitlines()]
    trajectories = (tmp_path / "runs" / "calculator-tasks" / "trajectories").glob("*.json")
    records = {r["rollout_id"]: r for r in map(orjson.loads, map(Path.read_bytes, trajectories))}
    assert len(records) == 4
    finished = {e["rollout_id"]: e for e in lines if e["kind"] == "rollout_finished"}
    assert finished.keys() == records.keys()
    for rollout_id, record in records.items():
        assert finished[rollout_id]["status"] == record["status"]
        assert finished[rollout_id]["reward"] == record["reward"]
        turns = [e for e in lines if e["rollout_id"] == rollout_id and e["kind"] == "turn_finished"]
        assert len(turns) == len(record["trajectory"]["turns"])
    assert lines[0]["kind"] == "rollout_started" and all(e["at"] > 0 for e in lines)


def test_sandbox_writable_lets_a_namespaced_program_write_only_the_folders_named(
    tmp_path: Path,
) -> None:
    """`--sandbox-writable` is `SandboxLimits.writable_paths` on the command line."""
    host = Path(tempfile.mkdtemp(dir=Path.home(), prefix="rollway-host-"))
    try:
        shared = host / "shared"
        shared.mkdir()
        program = host / "prog.py"  # the namespace sandbox hides the host's /tmp
        program.write_text(
            "import sys\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "    except OSError as exc:\n"
            "        print(path, exc.strerror, file=sys.stderr)\n"
        )
        args = ["run", "--cmd", f"{sys.executable} {program} {shared}/out {host}/out",
                "--tasks", str(TASKS), "--limit", "1", "--engine", "sim", "--sandbox",
                "namespace", "--out", str(tmp_path / "runs")]  # fmt: skip
        assert rollway(*args, cwd=tmp_path).returncode == 0
        assert not (shared / "out").exists() and not (host / "out").exists()
        again = rollway(*args, "--no-resume", "--sandbox-writable", str(shared), cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert (shared / "out").read_text() == "x" and not (host / "out").exists()
    finally:
        shutil.rmtree(host)
