"""The loop's record: one JSON line per step, a one-line summary, and a PNG of the run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends each step's metrics to ``path`` (JSONL, truncated on open) and keeps them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")
        self.steps: list[dict[str, Any]] = []

    def write(self, metrics: dict[str, Any]) -> None:
        self.steps.append(metrics)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(metrics) + "\n")


def step_line(m: dict[str, Any]) -> str:
    """A step as one human line: reward, ratio check, tokens, time split."""
    stale = (
        f" stale {m['ratio_dev_stale']:.1e} ({m['stale_tokens']} tok)" if m["stale_tokens"] else ""
    )
    return (
        f"step {m['step']:>3} v{m['policy_version']} | reward {m['reward_mean']:.3f} "
        f"± {m['reward_std']:.3f} | max|ratio-1| on-policy {m['ratio_dev_on_policy']:.1e} "
        f"({m['on_policy_tokens']} tok){stale} | rollout {m['rollout_s']:.1f}s "
        f"train {m['train_s']:.1f}s sync {m['sync_s']:.1f}s"
    )


def check_plotting() -> None:
    """Fail before training, not after it, when matplotlib (the ``rl`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the plot needs matplotlib: pip install -e '.[rl]' (or run with --no-plot)"
        ) from exc


def plot(steps: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Reward, ratio deviation, reply length and the step's time split, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [m["step"] for m in steps]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    reward, ratio, length, timing = axes.flat
    mean = [m["reward_mean"] for m in steps]
    std = [m["reward_std"] for m in steps]
    reward.plot(x, mean, marker="o")
    reward.fill_between(
        x,
        [a - b for a, b in zip(mean, std, strict=True)],
        [a + b for a, b in zip(mean, std, strict=True)],
        alpha=0.2,
    )
    reward.set(title="reward (mean ± std over rollouts)", xlabel="step")
    for dev, tokens, label in (
        ("ratio_dev_on_policy", "on_policy_tokens", "on-policy"),
        ("ratio_dev_stale", "stale_tokens", "stale"),
    ):
        shown = [m for m in steps if m[tokens]]
        if shown:  # log scale: an exact 0 is drawn at 1e-9
            values = [max(m[dev], 1e-9) for m in shown]
            ratio.semilogy([m["step"] for m in shown], values, marker="o", label=label)
    ratio.axhline(steps[0]["ratio_tol"], color="red", linestyle="--", label="tolerance")
    ratio.set(title="max |exp(new - recorded logprob) - 1| before the update", xlabel="step")
    ratio.legend()
    length.plot(x, [m["response_tokens_mean"] for m in steps], marker="o")
    length.set(title="sampled tokens per rollout (mean)", xlabel="step")
    bottom = [0.0] * len(steps)
    for key, label in (("rollout_s", "rollouts (wait)"), ("train_s", "train"), ("sync_s", "sync")):
        values = [m[key] for m in steps]
        timing.bar(x, values, bottom=bottom, label=label)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    timing.set(title="step time (s)", xlabel="step")
    timing.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
