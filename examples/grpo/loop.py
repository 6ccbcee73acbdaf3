"""The GRPO loop: rollouts through rollway (the embedded engine, or a vLLM server), one update,
new weights back.

A step: a batch of grouped rollouts (``collect``); the trainer's forward pass over the
recorded ids, whose ratios to the recorded logprobs must be 1 on on-policy tokens (the
mismatch to them is logged: ``split_mismatch``), then the clipped GRPO loss and one AdamW
step (``train_step``); the new weights pushed to the engine as the next version
(``push_weights``). With ``async_rollouts`` the next batch is already running while a step
trains (``RolloutFeed``), so part of it was sampled by the previous version: those tokens are
corrected by their recorded (behaviour) logprobs.
"""

from __future__ import annotations

import copy
import shutil
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from examples.grpo.config import GRPOConfig
from examples.grpo.metrics import MetricsLog, check_plotting, plot, step_line
from examples.grpo.objective import (
    RatioCheckError,
    group_advantages,
    grpo_loss,
    max_ratio_deviation,
    pack,
    token_logprobs,
)
from examples.grpo.tasks import TaskSet, load_task_set
from rollway.client import RolloutClient
from rollway.model_folders import resolve_model_path
from rollway.results import RolloutRecord
from rollway.trainers.mismatch import mismatch_metrics


class Trainer:
    """The trainer's own fp32 copy of the policy (never the engine's: its worker thread runs
    that one), its optimizer, the version its weights are (``version``: the engine's, which
    loaded the same checkpoint), and with KL a frozen reference."""

    def __init__(self, config: GRPOConfig, version: int) -> None:
        from transformers import AutoModelForCausalLM

        path = resolve_model_path(None)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        # eval() for the whole run: SmolLM2 has no dropout, so train() would compute the same
        # numbers, and eval() guarantees the loss's forward pass is the engine's function.
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
    return RolloutClient(
        task_set.agent,
        config.engine,
        store=str(config.out_dir / "rollouts"),
        exp_id=f"grpo-{config.task}",
        max_concurrent=config.prompts_per_step * config.group_size,
        max_staleness=1 if config.async_rollouts else None,
        temperature=config.temperature,
        max_tokens=config.max_tokens or task_set.max_tokens,
    )


def collect(
    client: RolloutClient, task_set: TaskSet, step: int, config: GRPOConfig
) -> list[RolloutRecord]:
    """Step ``step``'s rollouts: ``prompts_per_step`` tasks x ``group_size``."""
    tasks = task_set.for_step(step, config.prompts_per_step)
    return [item.result for item in client.run_batch(tasks, config.group_size, resume=False)]


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
        "rollouts": len(scored),
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


class RolloutFeed:
    """Step k's rollouts, on demand. Ahead (async): handing out batch k starts batch k+1 on
    a worker thread, so it samples while step k trains (and across its weight update)."""

    def __init__(
        self, client: RolloutClient, task_set: TaskSet, config: GRPOConfig, pool: ThreadPoolExecutor
    ) -> None:
        self.client, self.task_set, self.config, self.pool = client, task_set, config, pool
        self.next: Future[list[RolloutRecord]] | None = None

    def take(self, step: int) -> list[RolloutRecord]:
        if not self.config.async_rollouts:
            return collect(self.client, self.task_set, step, self.config)
        records = (self.next or self._start(step)).result()
        self.next = self._start(step + 1) if step + 1 < self.config.steps else None
        return records

    def _start(self, step: int) -> Future[list[RolloutRecord]]:
        return self.pool.submit(collect, self.client, self.task_set, step, self.config)


def run(config: GRPOConfig) -> list[dict[str, Any]]:
    """Train for ``config.steps`` steps; write ``metrics.jsonl`` (and ``metrics.png``) under
    ``config.out_dir``; return the steps' metrics."""
    if config.plot:
        check_plotting()
    task_set = load_task_set(config.task)
    log = MetricsLog(config.out_dir / "metrics.jsonl")
    # The client closes first (cancelling a batch still running), then the pool's thread ends.
    with ThreadPoolExecutor(1) as pool, make_client(config, task_set) as client:
        trainer = Trainer(config, client.policy_version or 0)
        if not config.engine.startswith("embedded"):
            # A server may hold an earlier run's weights (it outlives the run): it gets this
            # trainer's start weights first, so step 0 samples the model it trains.
            push_weights(client, trainer, config)
        feed = RolloutFeed(client, task_set, config, pool)
        for step in range(config.steps):
            started = time.perf_counter()
            records = feed.take(step)
            collected = time.perf_counter()
            metrics = train_step(trainer, records, config)
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
            )
            log.write(metrics)
            if config.verbose:
                print(step_line(metrics), flush=True)
    if config.plot:
        mode = "async" if config.async_rollouts else "sync"
        plot(log.steps, config.out_dir / "metrics.png", f"GRPO on {config.task} ({mode})")
    return log.steps
