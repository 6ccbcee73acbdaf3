"""The loop's settings, one frozen object (``python -m examples.grpo --help`` sets them)."""

from __future__ import annotations

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
    #: Rollouts of step k+1 run while step k trains (``max_staleness=1``).
    async_rollouts: bool = False
    #: What an update does to turns in flight (async mode, or groups carried over).
    update_mode: UpdateMode = "drain"
    #: Keep ``prompts_per_step * (1 + over_sample)`` groups going; the batch is the first
    #: ``prompts_per_step`` done, the rest are carried into the next step. None: 0.5 with
    #: ``async_rollouts``, else 0 (every token on-policy).
    over_sample: float | None = None
    #: Set aside groups whose rewards all agree (no advantage) and run new tasks instead.
    dynamic_sampling: bool = True
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
