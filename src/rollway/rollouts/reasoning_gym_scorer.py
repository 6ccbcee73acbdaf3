"""reasoning-gym's datasets as rollway scores them: a dataset rebuilt from the configuration its
rows carry (``task["scorer"]``, written by ``client.reasoning_gym_source``), and the dataset's
own ``score_answer(answer, entry)`` on the agent's final answer. reasoning-gym is an extra
(``rollway[reasoning-gym]``), imported only here, when a dataset is first built."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import orjson

from rollway.errors import ConfigError, RewardError
from rollway.trajectory import Trajectory

if TYPE_CHECKING:
    from types import ModuleType

#: What a row's ``scorer`` names (``rollouts.task_scorers``).
KIND = "reasoning_gym"
#: How much of the answer ``reward_info`` shows (an untagged answer is the whole reply, which
#: the trajectory already holds).
SHOWN_CHARS = 200
EXTRA_HINT = "reasoning-gym is not installed: pip install 'rollway[reasoning-gym]'"


def reasoning_gym() -> ModuleType:
    """The ``reasoning_gym`` package, or a ``ConfigError`` naming the extra."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(EXTRA_HINT, "tasks") from None
    module: ModuleType = reasoning_gym
    return module


def build_dataset(name: str, config: dict[str, Any]) -> Any:
    """Dataset ``name`` made with ``config`` (JSON values; a composite's ``datasets`` as
    ``[{"name", "weight", "config"}]``), the same object for the same configuration."""
    return _built(name, orjson.dumps(config, option=orjson.OPT_SORT_KEYS).decode())


@functools.lru_cache(maxsize=64)
def _built(name: str, config_json: str) -> Any:
    rg = reasoning_gym()
    config = orjson.loads(config_json)
    if name == "composite" and "datasets" in config:
        from reasoning_gym.composite import DatasetSpec

        config["datasets"] = [DatasetSpec(**spec) for spec in config["datasets"]]
    return rg.create_dataset(name, **config)


def final_answer(trajectory: Trajectory) -> str | None:
    """The agent's answer: its last turn's content, inside its last ``<answer>`` tags when it
    wrote them (reasoning-gym's prompt asks for them), else all of it."""
    text = trajectory.turns[-1].content if trajectory.turns else None
    if text is None:
        return None
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    return tagged if tagged is not None else text.strip()


def score_reasoning_gym(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
    """The dataset's own ``score_answer`` on the agent's final answer, naming the scorer."""
    scorer = task.get("scorer")
    if not isinstance(scorer, dict) or not isinstance(scorer.get("dataset"), str):
        raise RewardError("a reasoning-gym task's scorer needs its dataset's name")
    name, config = scorer["dataset"], scorer.get("config") or {}
    try:
        dataset = build_dataset(name, config)
    except ConfigError as exc:
        raise RewardError(exc.message) from None
    except Exception as exc:  # a configuration the dataset refuses: it would refuse it again
        reason = f"reasoning-gym cannot make {name} from the task's scorer: {exc}"
        raise RewardError(reason) from exc
    metadata = task.get("metadata") or {}
    entry = {"question": task.get("question"), "answer": task.get("answer"), "metadata": metadata}
    answer = final_answer(trajectory)
    scored = dataset.score_answer(answer, entry)
    source = metadata.get("source_dataset", name)
    shown = answer if answer is None or len(answer) <= SHOWN_CHARS else f"{answer[:SHOWN_CHARS]}..."
    return {"reward": float(scored), "scorer": f"{KIND}:{source}", "given_answer": shown}
