"""``python -m examples.grpo [--async] [--task calculator] ...``: run the GRPO loop.

Modes (the first line printed says which, with its figures):
  sync (default)  a step's groups run only while the trainer waits for its batch; the batch
                  is --prompts whole groups, every token sampled by the step's weights (none
                  carried over: a group that finished under older weights runs again), so
                  the ratio check covers every token.
  --async         step k+1's groups run while step k trains, (1 + --over-sample, default
                  0.5) x --prompts kept going and the rest carried into the next step: a
                  batch holds tokens of the step's
                  weights (ratio-checked) and one version behind (off-policy:
                  importance-corrected by their recorded logprobs, reported apart, not
                  checked); a group two versions behind runs again.
  --over-sample X without --async: sync, but (1 + X) x --prompts groups kept going and the
                  rest carried into the next step, one version behind (off-policy).
Flat groups (rewards all equal) are set aside and replaced, up to --max-extra-groups a step;
past that the batch is handed short, its line saying "lacking N". Each step's line gives the
ratio check over the on-policy tokens it covered (how many) and the off-policy tokens apart;
the last line sums both over the run."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from examples.grpo.config import GRPOConfig
from examples.grpo.loop import run
from examples.grpo.metrics import ratio_summary


def parse_config(argv: list[str] | None = None) -> GRPOConfig:
    d = GRPOConfig()
    p = argparse.ArgumentParser(
        prog="python -m examples.grpo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", choices=["one-word", "calculator"], default=d.task)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--prompts", type=int, default=d.prompts_per_step, help="tasks per step")
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--clip-eps", type=float, default=d.clip_eps)
    p.add_argument("--decoupled", dest="decoupled_weight_cap", type=float, nargs="?",
                   const=5.0, default=d.decoupled_weight_cap, metavar="CAP",
                   help="decoupled PPO: clip around the current weights, stale tokens weighted "
                   "by exp(current - recorded) capped at CAP (default 5)")  # fmt: skip
    p.add_argument("--kl-coef", type=float, default=d.kl_coef, help="0: no KL term")
    p.add_argument("--async", dest="async_rollouts", action="store_true",
                   help="sample step k+1 while step k trains: batches hold tokens one version "
                   "behind, importance-corrected, not ratio-checked (max_staleness=1)")  # fmt: skip
    p.add_argument("--over-sample", type=float, default=d.over_sample,
                   help="keep (1 + this) x --prompts groups going, carry the rest into the next "
                   "step, one version behind (default 0.5 with --async, else 0: nothing "
                   "carried, every token on-policy)")  # fmt: skip
    p.add_argument("--no-dynamic-sampling", dest="dynamic_sampling", action="store_false",
                   help="keep groups whose rewards all agree")  # fmt: skip
    p.add_argument("--max-extra-groups", type=int, default=d.max_extra_groups, metavar="N",
                   help="flat groups a step may set aside and replace before its batch is "
                   "handed short (default 4 x --prompts)")  # fmt: skip
    p.add_argument("--update-mode", choices=["abort", "drain", "keep"], default=d.update_mode)
    p.add_argument("--engine", default=d.engine,
                   help="embedded, or vllm://HOST:PORT?logprobs_mode=processed_logprobs (a "
                   "vLLM server on this machine, started with --logprobs-mode "
                   "processed_logprobs: scripts/rl_vllm.sh)")  # fmt: skip
    p.add_argument("--model", default=d.model,
                   help="a local HF model folder to train (e.g. Qwen3-0.6B's; default "
                   "SmolLM2-135M-Instruct)")  # fmt: skip
    p.add_argument("--freeze-embeddings", action=argparse.BooleanOptionalAction,
                   default=d.freeze_embeddings,
                   help="train all but the tied embedding (default: on vLLM only)")  # fmt: skip
    p.add_argument("--ratio-tol", type=float, default=d.ratio_tol)
    p.add_argument("--out", type=Path, default=d.out_dir)
    p.add_argument("--no-plot", dest="plot", action="store_false")
    args = vars(p.parse_args(argv))
    args["prompts_per_step"], args["out_dir"] = args.pop("prompts"), args.pop("out")
    return dataclasses.replace(d, **args)


def main() -> None:
    config = parse_config()
    started = time.perf_counter()
    steps = run(config)
    first, last = steps[0], steps[-1]
    print(
        f"reward {first['reward_mean']:.3f} at step 0 -> {last['reward_mean']:.3f} at step "
        f"{last['step']}; {ratio_summary(steps, config.ratio_tol)}; "
        f"{time.perf_counter() - started:.0f} s; metrics in {config.out_dir / 'metrics.jsonl'}"
        + (f", plot {config.out_dir / 'metrics.png'}" if config.plot else "")
    )


if __name__ == "__main__":
    main()
