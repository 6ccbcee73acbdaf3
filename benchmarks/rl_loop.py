"""The GRPO loop (examples/grpo) on the embedded model, synchronous vs asynchronous.

Runs the same loop ``--steps`` steps each way and reports the mean step time over steps 1..N-1
(step 0 has nothing to overlap: both wait for their first batch), split into the wait for
rollouts, the training step and the weight sync, then async's step time over sync's. Async
samples step k+1 while step k trains (``max_staleness=1``): its rollout wait shrinks, and its
share of tokens sampled by the previous version (stale) is reported. On a CPU the engine and
the trainer share the cores, so the overlap can only pay where one of them leaves cores idle.
``--engine vllm://...`` runs both on a vLLM server instead (``scripts/rl_vllm.sh --bench``
starts one; with ``VLLM_CORE=0 TRAINER_CORE=1`` the server and the trainer get a core each).
Usage: python benchmarks/rl_loop.py [--steps N] [--prompts N] [--group-size N] [--engine SPEC]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

# The examples are not an installed package: import them from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.grpo.config import GRPOConfig
from examples.grpo.loop import run

COLUMNS = ("rollout_s", "train_s", "sync_s", "step_s")


def measure(config: GRPOConfig) -> dict[str, Any]:
    steps = run(config)[1:]
    figures: dict[str, Any] = {key: statistics.fmean(m[key] for m in steps) for key in COLUMNS}
    tokens = sum(m["tokens"] for m in steps)
    figures["stale_share"] = sum(m["stale_tokens"] for m in steps) / tokens
    figures["reward_last"] = steps[-1]["reward_mean"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--engine", default="embedded")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 0 is left out)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, is_async in (("sync", False), ("async", True)):
            config = GRPOConfig(
                steps=args.steps,
                prompts_per_step=args.prompts,
                group_size=args.group_size,
                async_rollouts=is_async,
                engine=args.engine,
                out_dir=Path(tmp) / mode,
                plot=False,
                verbose=False,
            )
            results[mode] = measure(config)
    print(f"{args.prompts} prompts x {args.group_size}, steps 1..{args.steps - 1}, seconds/step:")
    print(f"{'mode':<6}" + "".join(f"{c.removesuffix('_s'):>9}" for c in COLUMNS) + "  stale")
    for mode, figures in results.items():
        row = "".join(f"{figures[c]:>9.2f}" for c in COLUMNS)
        print(f"{mode:<6}{row}  {figures['stale_share']:>5.0%}")
    ratio = results["async"]["step_s"] / results["sync"]["step_s"]
    print(f"async/sync step time: {ratio:.2f} (speed-up {1 / ratio:.2f}x)")


if __name__ == "__main__":
    main()
