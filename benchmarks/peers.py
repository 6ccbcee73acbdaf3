"""rollway's gateway against its peers, on the same load, interleaved in one process tree.

Each conversation has --turns turns (5): POST a chat completion with one tool and the growing
message list, then append the assistant message and a tool result (of --tool-result-words
words; long conversations show what a turn costs as the history grows). The inference server
is rollway's simulated one (a load generator) at zero latency, so what is measured is the
serving path:

  direct          the client calls the simulated OpenAI server itself (the load generator's ceiling)
  bare proxy      benchmarks/bare_proxy.py in front of it: the ceiling for any Python proxy
  LiteLLM         the LiteLLM proxy in front of it, one worker, no database (installed on first use
                  into ~/.cache/rollway/bench-venvs/, a minute or two; `--litellm-spec` to change)
  rollway         `rollway gateway` in front of the simulated SGLang server (rendering, tokenizing,
                  recording every turn); each conversation first registers a rollout
  rollway (sim)   `rollway gateway --engine sim`: the simulated engine in-process, no upstream

The proxy under test (with its children) is pinned to one core; the upstream servers and this
client share the other core(s). Repetitions are interleaved (rep -> system -> concurrency) so that
a busy machine slows every system alike, and each run starts once every server is idle (a proxy
still working on the last run would take the next system's core). A failed turn ends its
conversation and is counted (failed convs), not retried.

Usage: python benchmarks/peers.py [--quick] [--skip-litellm] [--reps N] [--concurrency 1,64,256]
       [--turns 5] [--tool-result-words 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


@dataclass(frozen=True)
class Shape:
    """What each conversation is: its turns, and the words of each tool result."""

    turns: int = 5
    tool_result_words: int = 0

    def tool_result(self, conversation: int, step: int) -> str:
        words = random.Random(conversation * 1000 + step).choices(WORDS, k=self.tool_result_words)
        return " ".join([f"fact {step}", *words])


TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}
FIRST = [{"role": "user", "content": "Look things up until you know the answer."}]
OUTPUT_LEN = 16
MAX_TOKENS = 64
REPO = Path(__file__).resolve().parent.parent
# An exact release, never "whatever is newest": LiteLLM's PyPI releases 1.82.7, 1.82.8 and
# 1.107.0 were malicious uploads (credential stealers). The later patch releases tried here
# (1.103.11, 1.104.9, 1.105.7, 1.106.x) want a certifi newer than the index this ran against.
LITELLM_SPEC = "litellm[proxy]==1.103.1"
VENVS = Path.home() / ".cache" / "rollway" / "bench-venvs"
CONVERSATIONS = {1: 100, 64: 640, 256: 1280}
QUICK_CONVERSATIONS = {1: 8, 64: 64, 256: 256}
ALL_CPUS = os.sched_getaffinity(0)

TurnFn = Callable[[aiohttp.ClientSession, str, list[dict]], Awaitable[dict]]
BeginFn = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


class Unavailable(Exception):
    """A system that cannot be installed or started here; the benchmark goes on without it."""


# ---- servers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and all its live descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def listens_on(proc: psutil.Process, port: int) -> bool:
    """Whether ``proc`` or a descendant listens on ``port`` (not some other process that took
    the port between our probe and its bind)."""
    for p in [proc, *proc.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
            return True
    return False


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen
    log: Path
    cpus: set[int]
    timeout_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tree(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)


def pin(tree: psutil.Process, cpus: set[int]) -> None:
    """Every thread of ``tree`` (affinity is per thread on Linux) to ``cpus``; threads and
    processes it starts later inherit it."""
    for proc in [tree, *tree.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            for thread in proc.threads():
                with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                    os.sched_setaffinity(thread.id, cpus)


class Servers:
    """Every server the benchmark starts, each in its own process group; ``close`` ends them all
    (SIGTERM, then SIGKILL for a group still there after 10 s)."""

    def __init__(self) -> None:
        self.logs = Path(tempfile.mkdtemp(prefix="rollway-peers-"))
        self.procs: list[subprocess.Popen] = []

    def launch(
        self,
        name: str,
        cmd: list[str],
        port: int,
        cpus: set[int],
        env: Mapping[str, str | None] | None = None,
        timeout_s: float = 120.0,
    ) -> Server:
        """Start ``cmd`` (``env`` is added to ours; a None value removes that variable)."""
        log = self.logs / (re.sub(r"\W+", "-", name) + ".log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as one, spared Ctrl-C
                # Start-up (imports) may use every core; `wait` pins the server once it listens.
                preexec_fn=lambda: os.sched_setaffinity(0, ALL_CPUS),
            )
        self.procs.append(proc)
        return Server(name, port, proc, log, cpus, timeout_s)

    @staticmethod
    def wait(servers: list[Server]) -> dict[str, Unavailable]:
        """Wait for ``servers`` (starting side by side) to listen, and pin each to its cores;
        the ones that exit or time out instead, with why."""
        started = time.monotonic()
        waiting, failed = list(servers), {}
        while waiting:
            for server in list(waiting):
                why = None
                if server.proc.poll() is not None:
                    tail = server.log.read_text(errors="replace")[-2000:]
                    why = f"exited with {server.proc.returncode}:\n{tail}"
                elif listens_on(server.tree, server.port):
                    pin(server.tree, server.cpus)
                    waiting.remove(server)
                elif time.monotonic() - started > server.timeout_s:
                    why = f"did not listen on port {server.port} in {server.timeout_s:.0f} s"
                if why is not None:
                    failed[server.name] = Unavailable(f"{server.name} {why}")
                    waiting.remove(server)
            if waiting:
                time.sleep(0.1)
        return failed

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # already gone
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # The group may outlive its leader (a worker process).
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.logs, ignore_errors=True)


def child_env() -> dict[str, str]:
    """This checkout's rollway for `python -m rollway`, whatever is installed."""
    paths = [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def sim_server(servers: Servers, protocol: str, cpus: set[int]) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "rollway", "sim-server", "--protocol", protocol]
    cmd += ["--port", str(port), "--latency-s", "0", "--output-len", str(OUTPUT_LEN)]
    return servers.launch(f"sim-server {protocol}", cmd, port, cpus, child_env())


def rollway_gateway(
    servers: Servers, name: str, engine: str, admin_key: str, cpus: set[int]
) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", engine, "--port", str(port)]
    env = {**child_env(), "ROLLWAY_ADMIN_KEY": admin_key}
    return servers.launch(name, cmd, port, cpus, env)


def bare_proxy(servers: Servers, upstream: str, cpus: set[int]) -> Server:
    port = free_port()
    script = str(Path(__file__).with_name("bare_proxy.py"))
    cmd = [sys.executable, script, "--upstream", upstream, "--port", str(port)]
    return servers.launch("bare proxy", cmd, port, cpus)


def install_venv(spec: str, env: Mapping[str, str] | None = None, niceness: int = 0) -> Path:
    """A virtualenv with ``spec`` installed, made on first use (minutes) and reused after.
    ``env`` is added to pip's environment (e.g. CMAKE_ARGS for a package built from source);
    pip runs at ``niceness`` (a build on a shared machine yields to the others)."""
    venv = VENVS / re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")
    stamp = venv / ".installed"
    if stamp.exists():
        return venv
    print(f"installing {spec} into {venv} (once; this may take minutes)", flush=True)
    started = time.monotonic()
    made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=False)
    if made.returncode:
        raise Unavailable(f"python -m venv exited with {made.returncode}")
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", spec]
    pip = subprocess.Popen(
        cmd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.nice(niceness),
    )
    shown, tail = 0.0, []
    try:
        assert pip.stdout is not None
        for line in pip.stdout:
            tail = [*tail[-19:], line.rstrip()]
            elapsed = time.monotonic() - started
            if elapsed - shown >= 5 or line.startswith(("Installing", "Successfully")):
                shown = elapsed
                print(f"  [{elapsed:4.0f} s] {line.strip()[:110]}", flush=True)
        code = pip.wait()
    finally:
        if pip.poll() is None:
            pip.kill()
            pip.wait()
    if code:
        raise Unavailable(f"pip install {spec} exited with {code}:\n" + "\n".join(tail))
    stamp.write_text(spec)
    print(f"  installed in {time.monotonic() - started:.0f} s", flush=True)
    return venv


def litellm_proxy(servers: Servers, spec: str, upstream: str, cpus: set[int]) -> Server:
    venv = install_venv(spec)
    config = servers.logs / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: sim\n"
        "    litellm_params:\n"
        "      model: openai/sim\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: dummy\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
    )
    port = free_port()
    cmd = [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--num_workers", "1"]
    env: dict[str, str | None] = {
        "LITELLM_LOG": "ERROR",
        # No fetch of the model price list from the internet at start-up; no telemetry.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        # No master key, no database: the plain proxy a user puts in front of vLLM.
        "LITELLM_MASTER_KEY": None,
        "DATABASE_URL": None,
    }
    return servers.launch("LiteLLM", cmd, port, cpus, env, timeout_s=300.0)


# ---- load ---------------------------------------------------------------------------------


async def post_json(session: aiohttp.ClientSession, url: str, body: dict, **headers: str) -> dict:
    headers = {"Content-Type": "application/json", **headers}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
        payload = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {payload[:300]!r}")
        return orjson.loads(payload)


def openai_turns(url: str) -> TurnFn:
    async def turn(session: aiohttp.ClientSession, rollout_id: str, messages: list[dict]) -> dict:
        body = {"model": "sim", "messages": messages, "tools": [TOOL], "max_tokens": MAX_TOKENS}
        answer = await post_json(session, f"{url}/v1/chat/completions", body)
        return answer["choices"][0]["message"]

    return turn


def rollway_calls(url: str, admin_key: str) -> tuple[BeginFn, TurnFn]:
    keys: dict[str, str] = {}

    async def begin(session: aiohttp.ClientSession, rollout_id: str) -> None:
        registered = await post_json(
            session,
            f"{url}/v1/rollouts/{rollout_id}/register",
            {"max_tokens": MAX_TOKENS},
            Authorization=f"Bearer {admin_key}",
        )
        keys[rollout_id] = registered["api_key"]

    async def turn(session: aiohttp.ClientSession, rollout_id: str, messages: list[dict]) -> dict:
        answer = await post_json(
            session,
            f"{url}/v1/rollouts/{rollout_id}/chat/completions",
            {"messages": messages, "tools": [TOOL]},
            Authorization=f"Bearer {keys[rollout_id]}",
        )
        return answer["choices"][0]["message"]

    return begin, turn


@dataclass
class System:
    name: str
    turn: TurnFn
    begin: BeginFn | None = None
    proxy: psutil.Process | None = None  # the process tree whose CPU time is charged


@dataclass
class Run:
    latencies_s: list[float]
    wall_s: float
    proxy_cpu_s: float
    errors: list[str]  # one per failed conversation: a failed turn ends its conversation

    @property
    def turns_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s


async def drive(system: System, conversations: int, concurrency: int, shape: Shape) -> Run:
    """``conversations`` conversations of ``shape``, ``concurrency`` at a time, on a fresh
    connection pool."""
    latencies: list[float] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(index: int) -> None:
            async with gate:
                rollout_id = f"p{index}-{uuid.uuid4().hex[:8]}"
                try:
                    await conversation(index, rollout_id)
                except (
                    aiohttp.ClientError,
                    TimeoutError,
                    RuntimeError,
                    KeyError,
                    ValueError,
                ) as error:
                    errors.append(f"{type(error).__name__}: {error}")

        async def conversation(index: int, rollout_id: str) -> None:
            if system.begin is not None:
                await system.begin(session, rollout_id)  # not a turn, but in the wall clock
            messages = list(FIRST)
            for step in range(shape.turns):
                started = time.perf_counter()
                message = await system.turn(session, rollout_id, messages)
                latencies.append(time.perf_counter() - started)
                result = {"role": "tool", "content": shape.tool_result(index, step)}
                messages = [*messages, message, result]

        cpu_before = tree_cpu_s(system.proxy) if system.proxy else 0.0
        started = time.perf_counter()
        await asyncio.gather(*[one(i) for i in range(conversations)])
        wall = time.perf_counter() - started
        cpu = tree_cpu_s(system.proxy) - cpu_before if system.proxy else 0.0
    return Run(latencies, wall, cpu, errors)


@dataclass
class Results:
    runs: dict[tuple[str, int], list[Run]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def median_rate(self, name: str, concurrency: int) -> float | None:
        runs = self.runs.get((name, concurrency))
        return statistics.median(r.turns_per_s for r in runs) if runs else None


#: Servers count as idle under this share of a core, summed; a run starts only then.
IDLE_SHARE = 0.05


async def settle(trees: list[psutil.Process], most_s: float = 60.0) -> float:
    """Wait until every server is idle; the seconds waited. A server may go on working after
    its run has been answered (LiteLLM's success callbacks and logging, seconds of them after a
    run at c=256) on the core the next system gets: without this, whichever system comes next
    is measured on part of a core."""
    started = time.monotonic()
    while time.monotonic() - started < most_s:
        before = sum(tree_cpu_s(tree) for tree in trees)
        await asyncio.sleep(0.5)
        if sum(tree_cpu_s(tree) for tree in trees) - before < IDLE_SHARE * 0.5:
            break
    return time.monotonic() - started


async def measure(
    systems: list[System],
    concurrencies: list[int],
    conversations: dict[int, int],
    reps: int,
    shape: Shape,
    servers: list[psutil.Process],
) -> Results:
    """Every system at every concurrency, ``reps`` times, each run starting once all
    ``servers`` are idle."""
    results = Results()
    for system in systems:  # a first pass that opens caches and code paths; not measured
        warm = await drive(system, 16, 16, shape)
        if not warm.latencies_s:
            results.failed[system.name] = f"warm-up failed: {warm.errors[0]}"
            print(f"  {system.name}: warm-up failed, left out: {warm.errors[0]}", flush=True)
    for rep in range(reps):
        for system in systems:
            if system.name in results.failed:
                continue
            rates = []
            for concurrency in concurrencies:
                waited = await settle(servers)
                if waited > 2.0:
                    rates.append(f"(servers busy {waited:.0f} s before)")
                run = await drive(system, conversations[concurrency], concurrency, shape)
                results.runs.setdefault((system.name, concurrency), []).append(run)
                failed = f" ({len(run.errors)} failed)" if run.errors else ""
                rates.append(f"c={concurrency} {run.turns_per_s:6.0f}{failed}")
            print(f"  rep {rep + 1} {system.name:<14} turns/s: " + "  ".join(rates), flush=True)
    return results


# ---- report -------------------------------------------------------------------------------


def percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:5.2f}" if a and b else "    -"


def report(
    results: Results,
    systems: list[System],
    concurrencies: list[int],
    conversations: dict,
    shape: Shape,
) -> None:
    rollway_names = [s.name for s in systems if s.name.startswith("rollway")]
    for concurrency in concurrencies:
        print(
            f"\nconcurrency {concurrency} ({conversations[concurrency]} conversations x "
            f"{shape.turns} turns per run):"
        )
        print(
            f"  {'system':<14} {'turns/s median (min-max)':>26} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'proxy CPU ms/turn':>17}  {'/direct':>7} {'/bare':>6} {'/LiteLLM':>8} "
            f"{'failed convs':>12}"
        )
        direct = results.median_rate("direct", concurrency)
        bare = results.median_rate("bare proxy", concurrency)
        litellm = results.median_rate("LiteLLM", concurrency)
        for system in systems:
            runs = results.runs.get((system.name, concurrency))
            if not runs:
                continue
            rates = [r.turns_per_s for r in runs]
            latencies = [x for r in runs for x in r.latencies_s]
            turns = sum(len(r.latencies_s) for r in runs)
            cpu = f"{sum(r.proxy_cpu_s for r in runs) / turns * 1000:9.3f}" if system.proxy else ""
            rate = statistics.median(rates)
            spread = f"{rate:7.0f} ({min(rates):.0f}-{max(rates):.0f})"
            ours = system.name in rollway_names
            print(
                f"  {system.name:<14} {spread:>26} {percentile_ms(latencies, 0.5):8.2f} "
                f"{percentile_ms(latencies, 0.99):8.2f} {cpu:>17}  {ratio(rate, direct):>7} "
                f"{ratio(rate, bare) if ours else '':>6} {ratio(rate, litellm) if ours else '':>8} "
                f"{sum(len(r.errors) for r in runs):>12}"
            )
    print(
        "\nturns/s: turns / wall clock of a run. rollway rows: each conversation first registers"
        " a rollout (an admin call, not a turn); its time is inside the wall clock, so inside"
        " turns/s, but not in the turn latencies. proxy CPU: user+system seconds of the proxy's"
        " process tree over the run (rollway (sim) includes its in-process engine)."
    )
    for (name, concurrency), runs in results.runs.items():
        errors = [e for r in runs for e in r.errors]
        if errors:
            print(
                f"{name}, c={concurrency}: {len(errors)} failed conversations, first: {errors[0]}"
            )
    for name, why in results.failed.items():
        print(f"{name}: no figures ({why})")


def machine_header() -> str:
    model = "unknown"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"machine: {os.cpu_count()} CPUs, {model}; load average {load}; "
        f"Python {platform.python_version()}\ncommit: {commit or 'unknown'}"
    )


def split_cores() -> tuple[set[int], set[int]]:
    """(the proxy's core, the client's and upstreams' cores)."""
    cores = sorted(ALL_CPUS)
    if len(cores) < 2:
        return set(cores), set(cores)
    return {cores[-1]}, set(cores[:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer conversations per run")
    parser.add_argument("--skip-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--litellm-spec", default=LITELLM_SPEC, help="the pip requirement")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,64,256", help="comma-separated levels")
    parser.add_argument("--turns", type=int, default=Shape.turns, help="turns per conversation")
    parser.add_argument(
        "--tool-result-words", type=int, default=Shape.tool_result_words, help="words per result"
    )
    args = parser.parse_args()
    shape = Shape(args.turns, args.tool_result_words)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    counts = QUICK_CONVERSATIONS if args.quick else CONVERSATIONS
    conversations = {c: counts.get(c, max(c, 10)) for c in concurrencies}

    print(machine_header())
    proxy_cpus, other_cpus = split_cores()
    if proxy_cpus == other_cpus:
        print("only one core: nothing is pinned")
    else:
        os.sched_setaffinity(0, other_cpus)
        print(f"proxy under test on core(s) {sorted(proxy_cpus)}; client and upstream servers "
              f"on {sorted(other_cpus)}")  # fmt: skip
    print(f"{shape.turns}-turn tool conversations ({shape.tool_result_words} words more per tool "
          f"result), simulated servers at zero latency, {OUTPUT_LEN} tokens per answer; "
          f"{args.reps} interleaved repetitions")  # fmt: skip

    # SIGTERM ends the benchmark like Ctrl-C does: through the finally below.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    servers = Servers()
    try:
        started = time.monotonic()
        openai_sim = sim_server(servers, "openai", other_cpus)
        sglang_sim = sim_server(servers, "sglang", other_cpus)
        for failure in servers.wait([openai_sim, sglang_sim]).values():
            raise failure
        admin_key = secrets.token_hex(16)
        # Started side by side; each is its own system, all share the proxy core while idle.
        proxies = [bare_proxy(servers, openai_sim.url, proxy_cpus)]
        if args.skip_litellm:
            print("LiteLLM: skipped (--skip-litellm)")
        else:
            try:
                proxies.append(
                    litellm_proxy(servers, args.litellm_spec, openai_sim.url, proxy_cpus)
                )
            except Unavailable as error:
                print(f"LiteLLM: skipped, {error}")
        sglang = f"sglang://{sglang_sim.url.removeprefix('http://')}"
        sim = f"sim://?latency_s=0&output_len={OUTPUT_LEN}"
        for name, engine in (("rollway", sglang), ("rollway (sim)", sim)):
            proxies.append(rollway_gateway(servers, name, engine, admin_key, proxy_cpus))
        failed = servers.wait(proxies)
        for name, error in failed.items():
            if name != "LiteLLM":
                raise error
            print(f"LiteLLM: skipped, {error}")
        print(f"servers up in {time.monotonic() - started:.0f} s", flush=True)
        systems = [System("direct", openai_turns(openai_sim.url))]
        for server in proxies:
            if server.name in failed:
                continue
            if server.name.startswith("rollway"):
                begin, turn = rollway_calls(server.url, admin_key)
                systems.append(System(server.name, turn, begin, server.tree))
            else:
                systems.append(System(server.name, openai_turns(server.url), proxy=server.tree))
        print(f"systems: {', '.join(s.name for s in systems)}", flush=True)
        trees = [psutil.Process(proc.pid) for proc in servers.procs]
        results = asyncio.run(
            measure(systems, concurrencies, conversations, args.reps, shape, trees)
        )
        report(results, systems, concurrencies, conversations, shape)
    finally:
        servers.close()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; every server it started has been stopped")
