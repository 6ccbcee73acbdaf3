"""The GRPO loop (examples/grpo, ``make rl``'s task) on the embedded model, in two configurations.

Two modes (``--modes A B``) run the same loop ``--steps`` steps each, interleaved ``--repeats``
times (A B A B ...: on a shared machine the load drifts, and both see the same drift). Step 0 is
left out (nothing to overlap: every mode waits for its first batch). Each run gives steps per
minute, the mean step time split into the wait for rollouts, the training step and the weight
sync, the trainer's input (tokens trained per second), informative groups (rewards differ: a
gradient) per step, the share of stale tokens (sampled by the previous version) and the ratio
check's worst on-policy deviation (over every step, 0 included); then B's steps per minute over
A's, per repeat, with their spread. The modes:

- ``sync``: sample, then train (``python -m examples.grpo``);
- ``async``: ``--async`` as it is, the step source with prefetch, ``over_sample=0.5`` and
  dynamic sampling (flat groups set aside and replaced);
- ``async-old``: ``--async --over-sample 0 --no-dynamic-sampling``, --async before the step
  source: step k+1's groups start when step k's batch is handed over, every one is waited for,
  flat ones are trained on. Unlike that loop, a failed rollout runs again (it was trained on),
  and the groups of the step after the last start beside the last training step (none did).

On a CPU the engine and the trainer share the cores, so overlap, and extra groups, cost the
trainer cores. ``--engine vllm://...`` runs on a vLLM server instead (``scripts/rl_vllm.sh
--bench`` starts one; with ``VLLM_CORE=0 TRAINER_CORE=1`` the server and the trainer get a core
each). Usage: python benchmarks/rl_loop.py [--modes A B] [--repeats N] [--steps N] [--prompts N]
[--group-size N] [--engine SPEC]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The examples are not an installed package: import them from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.grpo.config import GRPOConfig
from examples.grpo.loop import run

#: Each mode's settings over ``GRPOConfig``'s defaults (those of ``python -m examples.grpo``).
MODES: dict[str, dict[str, Any]] = {
    "sync": {"async_rollouts": False},
    "async": {"async_rollouts": True},
    "async-old": {"async_rollouts": True, "over_sample": 0.0, "dynamic_sampling": False},
}
COLUMNS = ("rollout_s", "train_s", "sync_s", "step_s")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs=2, choices=sorted(MODES), default=["sync", "async"],
                        metavar="MODE", help=f"two of {', '.join(MODES)}")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="A B pairs, interleaved")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--engine", default="embedded")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 0 is left out)")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.modes[0] == args.modes[1]:
        parser.error(f"--modes names {args.modes[0]} twice: give two different modes")
    return args


def config_for(mode: str, args: argparse.Namespace, out_dir: Path) -> GRPOConfig:
    base = GRPOConfig(
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        engine=args.engine,
        out_dir=out_dir,
        plot=False,
        verbose=False,
    )
    return dataclasses.replace(base, **MODES[mode])


def figures(run_steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A run's figures over its steps after step 0; the ratio check's over every step (with
    async on 2 cores, step 0's tokens may be the only on-policy ones)."""
    steps = run_steps[1:]
    seconds = sum(m["step_s"] for m in steps)
    tokens = sum(m["tokens"] for m in steps)
    found = {key: statistics.fmean(m[key] for m in steps) for key in COLUMNS}
    found.update(
        steps_per_min=60 * len(steps) / seconds,
        tokens_per_s=tokens / seconds,
        informative=statistics.fmean(m["informative_groups"] for m in steps),
        informative_per_min=60 * sum(m["informative_groups"] for m in steps) / seconds,
        set_aside=statistics.fmean(m["set_aside_flat"] for m in steps),
        stale_share=sum(m["stale_tokens"] for m in steps) / tokens,
        ratio_dev=max(m["ratio_dev_on_policy"] for m in run_steps),
        on_policy_tokens=sum(m["on_policy_tokens"] for m in run_steps),
        reward_last=steps[-1]["reward_mean"],
    )
    return found


def measure(mode: str, args: argparse.Namespace, out_dir: Path) -> dict[str, float]:
    """One run of ``mode``; the load average (1 min) before and after it with its figures.
    The ratio check runs at every step: a failure raises ``RatioCheckError`` here."""
    load_before = os.getloadavg()[0]
    found = figures(run(config_for(mode, args, out_dir)))
    found.update(load_before=load_before, load_after=os.getloadavg()[0])
    return found


HEADER = (
    f"{'run':<13}{'steps/min':>10}{'rollout':>8}{'train':>7}{'sync':>6}{'step':>7}"
    f"{'tok/s':>7}{'inform.':>8}{'flat out':>9}{'stale':>6}{'|r-1|':>9}{'on-pol':>7}{'load':>11}"
)


def row(name: str, f: dict[str, float]) -> str:
    return (
        f"{name:<13}{f['steps_per_min']:>10.2f}{f['rollout_s']:>8.2f}{f['train_s']:>7.2f}"
        f"{f['sync_s']:>6.2f}{f['step_s']:>7.2f}{f['tokens_per_s']:>7.1f}"
        f"{f['informative']:>8.2f}{f['set_aside']:>9.2f}{f['stale_share']:>6.0%}"
        f"{f['ratio_dev']:>9.1e}{f['on_policy_tokens']:>7.0f}{f['load_before']:>6.1f}-{f['load_after']:<4.1f}"
    )


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    """The modes' means (the runs' rows were printed as they came) and B over A per repeat."""
    first, second = args.modes
    for mode in args.modes:
        mean = {key: statistics.fmean(r[key] for r in runs[mode]) for key in runs[mode][0]}
        print(row(f"{mode} mean", mean))
    for key, what in (("steps_per_min", "steps/min"), ("informative_per_min", "informative "
                      "groups/min"), ("tokens_per_s", "trainer tokens/s")):  # fmt: skip
        ratios = [b[key] / a[key] for a, b in zip(runs[first], runs[second], strict=True)]
        spread = f"range {min(ratios):.2f}-{max(ratios):.2f}"
        if len(ratios) > 1:
            spread += f", stdev {statistics.stdev(ratios):.2f}"
        print(f"{second}/{first} {what}: {statistics.fmean(ratios):.2f} ({spread}; "
              f"{', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict[str, float]]]:
    args = parse(argv)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    print(
        f"{args.prompts} prompts x {args.group_size}, steps 1..{args.steps - 1} of each run, "
        f"{args.repeats} x ({' '.join(args.modes)}) interleaved, {os.cpu_count()} cores; "
        "seconds per step; |r-1| = the ratio check's worst on-policy deviation over the run's "
        "on-pol tokens; load = 1-min load average before-after the run:"
    )
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in args.modes:
                runs[mode].append(measure(mode, args, Path(tmp) / f"{mode}-{i}"))
                print(row(f"{mode} #{i + 1}", runs[mode][-1]), flush=True)  # as it comes
    report(args, runs)
    print(f"ratio check (|ratio - 1| <= {GRPOConfig.ratio_tol:g} on on-policy tokens) passed at "
          "every step of every run")  # fmt: skip
    return runs


if __name__ == "__main__":
    main()
