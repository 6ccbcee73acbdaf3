"""The GRPO loop: rollouts through rollway (the embedded engine, or a vLLM server), one update,
new weights back.

A step: a batch of whole groups from the client's step source (``open_source``: the first
``prompts_per_step`` groups done, flat groups set aside and replaced; in sync mode every token
is the step's weights', with over-sampling the rest are carried into the next step); the
trainer's forward pass over the recorded ids, whose ratios to the recorded
logprobs must be 1 on on-policy tokens (the mismatch of those and of the stale, carried ones is
logged apart: ``split_mismatch``), then the clipped GRPO loss and one AdamW step
(``train_step``); the new weights pushed to the engine as the next version (``push_weights``).
With ``async_rollouts`` the source keeps groups running while a step trains (``prefetch``), so
part of the next batch was sampled by the previous version: those tokens are corrected by their
recorded (behaviour) logprobs.
"""

from __future__ import annotations

import copy
import math
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from examples.grpo.config import (
    GRPOConfig,
    describe_mode,
    max_extra_groups,
    over_sample,
    source_staleness,
)
from examples.grpo.metrics import MetricsLog, check_plotting, plot, step_line
from examples.grpo.objective import (
    RatioCheckError,
    group_advantages,
    grpo_loss,
    informative_groups,
    max_ratio_deviation,
    pack,
    token_logprobs,
)
from examples.grpo.tasks import TaskSet, load_task_set
from rollway import resolve_model_path
from rollway.client import RolloutClient, StepBatch, StepSource
from rollway.results import RolloutRecord
from rollway.trainers.mismatch import mismatch_metrics


class Trainer:
    """The trainer's own fp32 copy of the policy (never the engine's: its worker thread runs
    that one), its optimizer, the version its weights are (``version``: the engine's, which
    loaded the same checkpoint), and with KL a frozen reference."""

    def __init__(self, config: GRPOConfig, version: int) -> None:
        from transformers import AutoModelForCausalLM

        path = resolve_model_path(config.model)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        # eval() for the whole run: SmolLM2 and Qwen3 train without dropout, so train() would
        # compute the same numbers, and eval() guarantees the loss's forward pass is the
        # engine's function.
        self.model.eval()
        if frozen_embeddings(config):
            self.model.get_input_embeddings().weight.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=0.0)
        self.reference = copy.deepcopy(self.model).requires_grad_(False) if config.kl_coef else None
        self.version = version


def frozen_embeddings(config: GRPOConfig) -> bool:
    if config.freeze_embeddings is not None:
        return config.freeze_embeddings
    return not config.engine.startswith("embedded")


def make_client(config: GRPOConfig, task_set: TaskSet) -> RolloutClient:
    """A client on ``config.engine``, sampling at ``config.temperature``: the recorded
    logprobs are that distribution's, the behaviour policy the trainer recomputes."""
    groups = math.ceil(config.prompts_per_step * (1 + over_sample(config)))
    return RolloutClient(
        task_set.agent,
        config.engine,
        model=config.model,
        store=str(config.out_dir / "rollouts"),
        exp_id=f"grpo-{config.task}",
        max_concurrent=groups * config.group_size,
        max_staleness=1 if config.async_rollouts else None,
        temperature=config.temperature,
        max_tokens=config.max_tokens or task_set.max_tokens,
        reward=task_set.reward,
    )


def open_source(client: RolloutClient, task_set: TaskSet, config: GRPOConfig) -> StepSource:
    """The run's batches: ``prompts_per_step`` whole groups of ``group_size`` a step, flat
    groups replaced up to ``max_extra_groups``. A group more versions behind than
    ``source_staleness`` allows when it is handed over runs again (``stale="restart"``): in
    sync mode any that finished under older weights (0), in async mode any two behind (1). In
    async mode groups start while the trainer trains (``prefetch``). A run trains fresh
    weights, so the task stream starts afresh too (``resume=False``)."""
    return client.step_source(
        task_set.stream(),
        group_size=config.group_size,
        groups_per_step=config.prompts_per_step,
        over_sample=over_sample(config),
        dynamic_sampling=config.dynamic_sampling,
        max_extra_groups=max_extra_groups(config),
        max_staleness=source_staleness(config),
        stale="restart",
        prefetch=config.async_rollouts,
        resume=False,
    )


def next_batch(source: StepSource, step: int) -> StepBatch:
    """Step ``step``'s batch. The tasks never run out, so an empty batch (the source hands one
    and goes on) had every group of the step set aside as flat up to its cap on extra groups:
    this loop stops there rather than train a step on nothing."""
    batch = next(source, None)
    if batch is None or not batch.groups:
        raise RuntimeError(
            f"step {step}: every group's rewards agreed (no advantage) up to the cap on extra "
            "groups; raise --max-extra-groups, --max-tokens or --group-size, or run with "
            "--no-dynamic-sampling"
        )
    return batch


def source_metrics(batch: StepBatch) -> dict[str, Any]:
    """The step source's figures for ``batch`` (``StepMetrics``: groups used and lacking, set
    aside, refilled, carried over, stale, tokens by versions behind, the trainer's wait)."""
    figures = batch.metrics.to_dict()
    del figures["step"]  # the loop's own
    return figures


def train_step(
    trainer: Trainer, records: Sequence[RolloutRecord], config: GRPOConfig
) -> dict[str, Any]:
    """One update from ``records``; raises ``RatioCheckError`` before touching the weights if
    the forward pass does not reproduce the recorded logprobs of on-policy tokens."""
    scored = [r for r in records if r.success and r.reward is not None]
    if not scored:
        raise RuntimeError(f"no rollout of {len(records)} succeeded: {records[0].reason}")
    refuse_raw_logprobs(scored, config.temperature)
    advantages = group_advantages(scored)
    batch = pack([(s, advantages[r.rollout_id]) for r in scored for s in r.trajectory.samples])
    new = token_logprobs(
        trainer.model, batch, config.temperature
    )  # the forward pass the loss is built from
    on_policy = batch.on_policy(trainer.version)
    deviation = max_ratio_deviation(new, batch.behaviour_logprobs, on_policy)
    if deviation > config.ratio_tol:
        raise RatioCheckError(
            f"max |ratio - 1| = {deviation:.3e} > {config.ratio_tol:g} on tokens of version "
            f"{trainer.version}: the recorded logprobs are not the trained model's"
        )
    reference = None
    if trainer.reference is not None:
        with torch.no_grad():
            reference = token_logprobs(trainer.reference, batch, config.temperature)
    loss, stats = grpo_loss(
        new, batch, config.clip_eps, config.kl_coef, reference, config.decoupled_weight_cap
    )
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.params, config.max_grad_norm)
    trainer.optimizer.step()
    rewards_R = [float(r.reward) for r in scored]
    tokens = int(batch.rows.numel())
    return {
        "policy_version": trainer.version,
        "reward_mean": statistics.fmean(rewards_R),
        "reward_std": statistics.pstdev(rewards_R),
        "reward_components": component_means(scored),
        "rollouts": len(scored),
        "informative_groups": informative_groups(scored),
        "failed": len(records) - len(scored),
        "tokens": tokens,
        "response_tokens_mean": tokens / len(scored),
        "on_policy_tokens": int(on_policy.sum()),
        "stale_tokens": tokens - int(on_policy.sum()),
        "ratio_dev_on_policy": deviation,
        "ratio_dev_stale": max_ratio_deviation(new, batch.behaviour_logprobs, ~on_policy),
        **split_mismatch(new, batch.behaviour_logprobs, on_policy),
        "loss": loss.item(),
        "grad_norm": float(grad_norm),
        **stats,
    }


def component_means(records: Sequence[RolloutRecord]) -> dict[str, float]:
    """Each reward component's mean over the records that have it ({} for a reward without
    components): what the reward is made of, as TRL's ``rewards/<func>/mean``."""
    values: dict[str, list[float]] = {}
    for record in records:
        for name, value in record.reward_components.items():
            values.setdefault(name, []).append(value)
    return {name: statistics.fmean(found) for name, found in sorted(values.items())}


def refuse_raw_logprobs(records: Sequence[RolloutRecord], temperature: float) -> None:
    """At T != 1 the trainer recomputes ``log_softmax(logits / T)``: temperature-1 logprobs
    (a vLLM server in its default mode) would fail the ratio check for a reason it cannot name."""
    if temperature == 1.0:
        return
    kinds = {t.logprob_kind for r in records if r.trajectory for t in r.trajectory.turns}
    if "raw_logprobs" in kinds:
        raise RatioCheckError(
            f"the engine recorded temperature-1 logprobs at temperature {temperature:g}: start "
            "vLLM with --logprobs-mode processed_logprobs and add ?logprobs_mode="
            "processed_logprobs to the engine spec, or sample at --temperature 1"
        )


def split_mismatch(
    new: torch.Tensor, recorded: torch.Tensor, on_policy: torch.Tensor
) -> dict[str, float]:
    """``mismatch_metrics`` of the on-policy tokens and of the stale ones, before the update:
    ``logprob_diff_mean_on_policy``, ``k3_kl_stale``... (the token counts are logged apart)."""
    metrics: dict[str, float] = {}
    for part, where in (("on_policy", on_policy), ("stale", ~on_policy)):
        found = mismatch_metrics(new, recorded, where)
        metrics.update({f"{key}_{part}": v for key, v in found.items() if key != "tokens"})
    return metrics


def push_weights(client: RolloutClient, trainer: Trainer, config: GRPOConfig) -> dict[str, Any]:
    """Load the trainer's weights into the engine as the next version: in memory for the
    embedded engine (it copies them), else as a checkpoint folder the server reloads."""
    version = trainer.version + 1
    source: Any = trainer.model.state_dict()
    if not config.engine.startswith("embedded"):
        source = save_checkpoint(trainer, config.out_dir / "weights", version)
    update = client.update_weights(source, version, mode=config.update_mode)
    trainer.version = update["policy_version"]
    return update


def save_checkpoint(trainer: Trainer, root: Path, version: int) -> Path:
    """The trainer's weights as ``root/v<version>`` (safetensors and config, what vLLM
    reloads); the folder before the previous one goes (the engine keeps the last one to load
    again if its server restarts, and each is half a gigabyte in fp32)."""
    folder = root / f"v{version}"
    trainer.model.save_pretrained(folder, safe_serialization=True)
    shutil.rmtree(root / f"v{version - 2}", ignore_errors=True)
    return folder


def run_step(
    client: RolloutClient, trainer: Trainer, source: StepSource, step: int, config: GRPOConfig
) -> dict[str, Any]:
    """One step: take the batch, train on it, push the weights; the step's metrics."""
    started = time.perf_counter()
    batch = next_batch(source, step)
    collected = time.perf_counter()
    metrics = train_step(trainer, batch.records, config)
    trained = time.perf_counter()
    update = push_weights(client, trainer, config)
    synced = time.perf_counter()
    metrics.update(
        step=step,
        rollout_s=collected - started,
        train_s=trained - collected,
        sync_s=synced - trained,
        step_s=synced - started,
        stale_restarts=update["stale_restarts"],
        ratio_tol=config.ratio_tol,
        **source_metrics(batch),
    )
    return metrics


def run(config: GRPOConfig, task_set: TaskSet | None = None) -> list[dict[str, Any]]:
    """Train for ``config.steps`` steps on ``task_set`` (default: ``config.task``'s); write
    ``metrics.jsonl`` (and ``metrics.png``) under ``config.out_dir``; return the steps'
    metrics."""
    if config.plot:
        check_plotting()
    task_set = task_set or load_task_set(config.task)
    log = MetricsLog(config.out_dir / "metrics.jsonl")
    if config.verbose:
        print(describe_mode(config), flush=True)
    with make_client(config, task_set) as client:
        trainer = Trainer(config, client.policy_version or 0)
        if not config.engine.startswith("embedded"):
            # A server may hold an earlier run's weights (it outlives the run): it gets this
            # trainer's start weights first, so step 0 samples the model it trains.
            push_weights(client, trainer, config)
        # Closing the source cancels the groups still running (the run is over).
        with open_source(client, task_set, config) as source:
            for step in range(config.steps):
                metrics = run_step(client, trainer, source, step, config)
                log.write(metrics)
                if config.verbose:
                    print(step_line(metrics), flush=True)
    if config.plot:
        mode = "async" if config.async_rollouts else "sync"
        plot(log.steps, config.out_dir / "metrics.png", f"GRPO on {config.task} ({mode})")
    return log.steps
