"""The loop's record: one JSON line per step, a line per step and one for the run, and a PNG
of the run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes


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
    """A step as one human line: reward, the step source's groups, the ratio check over the
    step's on-policy tokens (how many it covered) with their mismatch, the off-policy tokens'
    mismatch apart (not checked: importance-corrected), time split."""
    return (
        f"step {m['step']:>3} v{m['policy_version']} | reward {m['reward_mean']:.3f} "
        f"± {m['reward_std']:.3f}{_components(m)} | {_groups(m)} | {_checks(m)} | "
        f"rollout {m['rollout_s']:.1f}s train {m['train_s']:.1f}s sync {m['sync_s']:.1f}s"
    )


def _checks(m: dict[str, Any]) -> str:
    if m["on_policy_tokens"]:
        checked = (
            f"ratio check over {m['on_policy_tokens']} on-policy tok: {_mismatch(m, 'on_policy')}"
        )
    else:
        checked = "ratio check: no on-policy tok"
    if not m["stale_tokens"]:
        return checked
    return f"{checked} | {m['stale_tokens']} off-policy tok (not checked): {_mismatch(m, 'stale')}"


def ratio_summary(steps: Sequence[dict[str, Any]], tolerance: float) -> str:
    """The run's ratio check in one clause: over which tokens of which steps it ran, and the
    off-policy tokens (importance-corrected, never checked) apart."""
    checked = [m for m in steps if m["on_policy_tokens"]]
    unchecked = [m["step"] for m in steps if not m["on_policy_tokens"]]
    if checked:
        found = (
            f"max |ratio-1| {max(m['ratio_dev_on_policy'] for m in checked):.1e} over "
            f"{sum(m['on_policy_tokens'] for m in checked)} on-policy tokens of {len(checked)} "
            f"of {_count(len(steps), 'step')} (tolerance {tolerance:g})"
        )
    else:
        found = f"no on-policy token in {_count(len(steps), 'step')}"
    if unchecked and checked:
        found += f", none in step{'s' if len(unchecked) > 1 else ''} {_spans(unchecked)}"
    off = [m for m in steps if m["stale_tokens"]]
    if not off:
        return f"ratio check: {found}; no off-policy token"
    return (
        f"ratio check: {found}; off-policy (not checked): max |ratio-1| "
        f"{max(m['ratio_dev_stale'] for m in off):.1e} over "
        f"{sum(m['stale_tokens'] for m in off)} tokens of {_count(len(off), 'step')}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _spans(steps: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][-1] + 1:
            spans[-1].append(step)
        else:
            spans.append([step])
    return ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in spans)


def _components(m: dict[str, Any]) -> str:
    """The reward's components' means, when it has any: `` (form 0.412, truth 0.250)``."""
    components = m.get("reward_components") or {}
    shown = ", ".join(f"{name} {value:.3f}" for name, value in components.items())
    return f" ({shown})" if shown else ""


def _groups(m: dict[str, Any]) -> str:
    """The step source's account: groups used (and lacking), set aside, refilled, carried."""
    lacking = f" (lacking {m['lacking']})" if m["lacking"] else ""
    refilled = sum(m["refilled"].values())
    return (
        f"groups {m['groups_used']}{lacking}, set aside {m['set_aside_flat']} flat"
        f" {m['set_aside_failed']} failed, {refilled} refilled, {m['carried_over']} carried"
    )


def _mismatch(m: dict[str, Any], part: str) -> str:
    return (
        f"max|ratio-1| {m[f'ratio_dev_{part}']:.1e} |Δlogp| {m[f'logprob_diff_mean_{part}']:.1e}"
        f" k3 {m[f'k3_kl_{part}']:.1e} out {m[f'ratio_outside_{part}']:.0%}"
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
    """Reward (and its components), reply length, the step's time split, the step source's
    groups and tokens by versions behind, and the mismatch panels, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [m["step"] for m in steps]
    fig, axes = plt.subplots(2, 4, figsize=(20, 7), constrained_layout=True)
    reward, length, timing, groups, ratio, diff, outside, staleness = axes.flat
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
    plot_components(steps, reward)
    length.plot(x, [m["response_tokens_mean"] for m in steps], marker="o")
    length.set(title="sampled tokens per rollout (mean)", xlabel="step")
    bottom = [0.0] * len(steps)
    for key, label in (("rollout_s", "rollouts (wait)"), ("train_s", "train"), ("sync_s", "sync")):
        values = [m[key] for m in steps]
        timing.bar(x, values, bottom=bottom, label=label)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    timing.set(title="step time (s)", xlabel="step")
    timing.legend()
    plot_source(steps, groups, staleness)
    plot_mismatch(steps, ratio, diff, outside)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_components(steps: Sequence[dict[str, Any]], reward: Axes) -> None:
    """Each reward component's mean per step, dashed beside the reward (a step without a
    component leaves a gap); nothing for a reward without components."""
    names = sorted({name for m in steps for name in m.get("reward_components") or {}})
    x = [m["step"] for m in steps]
    for name in names:
        values = [(m.get("reward_components") or {}).get(name, math.nan) for m in steps]
        reward.plot(x, values, marker=".", linestyle="--", label=f"reward/{name} (mean)")
    if names:
        reward.legend()


def plot_source(steps: Sequence[dict[str, Any]], groups: Axes, staleness: Axes) -> None:
    """The step source per step: groups used, set aside and carried over; the handed tokens
    by how many versions behind the trainer's weights they were sampled."""
    x = [m["step"] for m in steps]
    bottom = [0] * len(steps)
    for key, label in (("groups_used", "used"), ("set_aside_flat", "set aside (flat)"),
                       ("set_aside_failed", "set aside (failed)")):  # fmt: skip
        values = [m[key] for m in steps]
        groups.bar(x, values, bottom=bottom, label=label)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    groups.plot(x, [m["carried_over"] for m in steps], "ko-", label="carried over")
    groups.set(title="groups per step", xlabel="step")
    groups.legend()
    lags = sorted({int(k) for m in steps for k in m["staleness"]})
    bottom = [0] * len(steps)
    for lag in lags:
        values = [m["staleness"].get(str(lag), 0) for m in steps]
        staleness.bar(x, values, bottom=bottom, label=f"{lag} behind")
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    staleness.set(title="tokens handed over, by versions behind", xlabel="step")
    if lags:
        staleness.legend()


def plot_mismatch(steps: Sequence[dict[str, Any]], ratio: Axes, diff: Axes, outside: Axes) -> None:
    """The trainer's recompute against the recorded logprobs, before each update: on-policy
    and stale tokens apart, each only on steps that have some (log scales: an exact 0 is
    drawn at 1e-9 for the ratio, 1e-16 for the logprob diff and KL)."""
    for part, label in (("on_policy", "on-policy (checked)"), ("stale", "off-policy")):
        shown = [m for m in steps if m[f"{part}_tokens"]]
        if not shown:
            continue
        x = [m["step"] for m in shown]
        ratio.semilogy(
            x, [max(m[f"ratio_dev_{part}"], 1e-9) for m in shown], marker="o", label=label
        )
        line = diff.semilogy(
            x,
            [max(m[f"logprob_diff_mean_{part}"], 1e-16) for m in shown],
            marker="o",
            label=f"mean |Δlogprob|, {label}",
        )[0]
        diff.semilogy(
            x,
            [max(m[f"k3_kl_{part}"], 1e-16) for m in shown],
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"k3 KL(recorded || new), {label}",
        )
        outside.plot(x, [m[f"ratio_outside_{part}"] for m in shown], marker="o", label=label)
    ratio.axhline(steps[0]["ratio_tol"], color="red", linestyle="--", label="tolerance")
    ratio.set(title="max |exp(new - recorded) - 1| before the update", xlabel="step")
    diff.set(title="logprob mismatch before the update", xlabel="step")
    outside.set(
        title="share of tokens with exp(new - recorded) ∉ [0.9, 1.1]",
        xlabel="step",
        ylim=(-0.02, 1.02),
    )
    for ax in (ratio, diff, outside):
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
