"""The loop's settings, one frozen object (``python -m examples.grpo --help`` sets them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

UpdateMode = Literal["abort", "drain", "keep"]


@dataclass(frozen=True)
class GRPOConfig:
    #: ``one-word`` (format reward, single turn) or ``calculator`` (tools, multi-turn).
    task: str = "one-word"
    steps: int = 12
    prompts_per_step: int = 8
    group_size: int = 4
    #: Per model call; None: the task's own (one-word 12, calculator 48).
    max_tokens: int | None = None
    #: The sampling temperature; the trainer recomputes its logprobs at the same one, and the
    #: recorded logprobs are that distribution's (``log_softmax(logits / T)``).
    temperature: float = 0.7
    lr: float = 3e-5
    clip_eps: float = 0.2
    #: Decoupled PPO: clip around the trainer's weights, correct stale tokens with a detached
    #: importance weight to the recorded logprobs, capped here (None: plain PPO's clip).
    decoupled_weight_cap: float | None = None
    max_grad_norm: float = 1.0
    #: > 0 adds KL(new || initial weights) to the loss (and a frozen reference copy).
    kl_coef: float = 0.0
    #: False (sync): a step's groups run only while the trainer waits for its batch, so every
    #: handed token is the step's weights'. True (async): step k+1's groups run while step k
    #: trains, so a batch holds tokens one version behind (``max_staleness=1``).
    async_rollouts: bool = False
    #: What an update does to turns in flight (async mode, or groups carried over).
    update_mode: UpdateMode = "drain"
    #: Keep ``prompts_per_step * (1 + over_sample)`` groups going; the batch is the first
    #: ``prompts_per_step`` done, the rest are carried into the next step. None: 0.5 with
    #: ``async_rollouts``, else 0 (nothing carried: every token on-policy).
    over_sample: float | None = None
    #: Set aside groups whose rewards all agree (no advantage) and run new tasks instead.
    dynamic_sampling: bool = True
    #: Flat groups a step may set aside and replace before its batch is handed short
    #: (``batch.lacking``). None: 4 x ``prompts_per_step`` (over half of an untrained policy's
    #: groups are flat, and more of a trained one's).
    max_extra_groups: int | None = None
    #: Where rollouts are sampled: the embedded engine (weights pushed in memory), or a vLLM
    #: server on this machine (``vllm://HOST:PORT?logprobs_mode=processed_logprobs``: weights
    #: pushed as a checkpoint folder under ``out_dir/weights``, which the server reloads).
    engine: str = "embedded"
    #: The policy: a local HF model folder (a Qwen3 one gets the ``qwen3`` renderer), which the
    #: embedded engine samples and the trainer trains; None: SmolLM2-135M-Instruct.
    model: str | None = None
    #: Train all weights but the (tied) token embedding. None: only on a vLLM server, whose CPU
    #: build (0.32) keeps a stale packed copy of a tied output layer after ``reload_weights``:
    #: its logprobs would then be up to 1e-2 off the trainer's (docs/engines.md).
    freeze_embeddings: bool | None = None
    #: Largest |exp(new - recorded) - 1| allowed on on-policy tokens before the update.
    ratio_tol: float = 1e-3
    out_dir: Path = Path("rollway-runs/grpo")
    plot: bool = True
    #: Print a line per step.
    verbose: bool = True


def over_sample(config: GRPOConfig) -> float:
    """The share of extra groups kept going: the config's, else 0.5 in async mode (the long
    tail is carried over) and 0 in sync mode (every token on-policy)."""
    if config.over_sample is not None:
        return config.over_sample
    return 0.5 if config.async_rollouts else 0.0


def max_extra_groups(config: GRPOConfig) -> int:
    """Flat groups a step may replace: the config's, else 4 x ``prompts_per_step`` (the step
    source's own default, one batch's worth, left 6 of 8 groups at the start of a run and 2 of
    8 once the policy answered most questions the same way in every sample)."""
    if config.max_extra_groups is not None:
        return config.max_extra_groups
    return 4 * config.prompts_per_step


def carries_groups(config: GRPOConfig) -> bool:
    """Whether groups may run across a weight update (prefetch, or over-sampling): only then
    may a batch hold tokens of older weights."""
    return config.async_rollouts or over_sample(config) > 0


def source_staleness(config: GRPOConfig) -> int:
    """How many versions behind a handed token may be: 1 where groups run across updates,
    else 0. In sync mode a batch handed short leaves the groups still running to go on; with 0
    those that finish under the old weights run again, so none reaches a batch stale."""
    return 1 if carries_groups(config) else 0


def describe_mode(config: GRPOConfig) -> str:
    """What the run's mode does, in one line (printed at the start)."""
    batch = f"{config.prompts_per_step} groups x {config.group_size}"
    extra = (
        f"flat groups set aside and replaced, up to {max_extra_groups(config)} a step (past "
        "that the batch is handed short: 'lacking N')"
        if config.dynamic_sampling
        else "flat groups kept"
    )
    if not carries_groups(config):
        return (
            f"sync: each step's batch is {batch}, sampled by the step's weights only: groups "
            "run only while the trainer waits, none is carried over, and one that finished "
            f"under older weights runs again; {extra}; the ratio check covers every token"
        )
    going = math.ceil(config.prompts_per_step * (1 + over_sample(config)))
    when = (
        "step k+1's groups run while step k trains"
        if config.async_rollouts
        else "groups run only while the trainer waits"
    )
    return (
        f"{'async' if config.async_rollouts else 'sync, over-sampled'}: each step's batch is "
        f"{batch}, the first done of up to {going} kept going ({when}; the rest carried into "
        f"the next step); {extra}; its tokens are the step's weights' (ratio-checked) or one "
        "version behind (off-policy: importance-corrected by their recorded logprobs, reported "
        "apart); a group further behind runs again"
    )
