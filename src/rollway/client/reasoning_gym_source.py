"""reasoning-gym's procedural datasets as tasks: ``reasoning-gym:NAME?size=N&seed=S&OPTION=V``.

Each row is one dataset entry: ``question``, ``messages`` (reasoning-gym's system prompt asking
for ``<answer>`` tags, then the question), ``answer``, ``metadata``, a ``task_id`` made from
the dataset, its options and the index (the same spec names the same tasks, so a run resumes),
and the ``scorer`` that rebuilds the dataset to score an answer with its own ``score_answer``
(``rollouts.reasoning_gym_scorer``). A composite mixes datasets:
``reasoning-gym:composite?datasets=leg_counting,basic_arithmetic&size=20``, each one's options
and weight as ``NAME.OPTION=V`` and ``NAME.weight=2``.

Options are the dataset's configuration fields, read by the type of their defaults (``true``,
``3``, ``0.5``, ``+,-`` for a list); ``seed`` is 0 unless given (reasoning-gym's own default
draws a fresh one each time), ``size`` is the dataset's default; ``system`` picks one of
reasoning-gym's system prompts (``default``) or ``none``."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from typing import Any
from urllib.parse import unquote

import orjson

from rollway.errors import ConfigError
from rollway.rollouts.reasoning_gym_scorer import KIND, build_dataset, reasoning_gym
from rollway.rollouts.task_scorers import SCORER_FIELD

SCHEME = "reasoning-gym:"
#: Spec options that are rollway's, not the dataset's.
SYSTEM_OPTION = "system"
DEFAULT_SEED = 0


def reasoning_gym_tasks(spec: str) -> list[dict[str, Any]]:
    """The rows ``spec`` (``reasoning-gym:NAME?...``) names; a ``ConfigError`` naming what is
    wrong with it (an unknown dataset with the close names, an unknown or ill-typed option)."""
    name, options = _parse(spec)
    system = _system_prompt(options.pop(SYSTEM_OPTION, "default"))
    config = _composite_config(options) if name == "composite" else _config(name, options)
    config.setdefault("seed", DEFAULT_SEED)
    try:
        dataset = build_dataset(name, config)
    except ConfigError:
        raise
    except Exception as exc:  # reasoning-gym's own checks: asserts, ValueError, TypeError
        reason = str(exc) or type(exc).__name__
        raise ConfigError(f"{spec}: reasoning-gym refuses this {name}: {reason}", "tasks") from None
    digest = _digest(name, config)
    scorer = {"kind": KIND, "dataset": name, "config": config}
    return [_row(entry, index, f"rg-{name}-{digest}", system, scorer)
            for index, entry in enumerate(dataset)]  # fmt: skip


def _row(
    entry: dict[str, Any], index: int, prefix: str, system: str | None, scorer: dict[str, Any]
) -> dict[str, Any]:
    question = entry["question"]
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    row = {
        "task_id": f"{prefix}-{index}",
        "question": question,
        "messages": messages,
        "answer": entry["answer"],
        "metadata": entry.get("metadata", {}),
        SCORER_FIELD: scorer,
    }
    # As a record will store it (tuples as lists, odd values as text), so the row scored now
    # is the row scored again from the store.
    stored: dict[str, Any] = orjson.loads(
        orjson.dumps(row, default=str, option=orjson.OPT_NON_STR_KEYS)
    )
    return stored


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    body = spec.removeprefix(SCHEME)
    name, _, query = body.partition("?")
    if not name:
        raise ConfigError(f"{spec}: name a dataset (reasoning-gym:NAME)", "tasks")
    _known_dataset(name, spec)
    options: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, equals, value = part.partition("=")
        key = unquote(key)
        if not equals or not key:
            raise ConfigError(f"{spec}: option {part!r} needs the form OPTION=VALUE", "tasks")
        if key in options:
            raise ConfigError(f"{spec}: option {key!r} is given twice", "tasks")
        options[key] = unquote(value)  # not unquote_plus: a '+' is an operator here
    return name, options


def _known_dataset(name: str, spec: str) -> None:
    names = sorted(reasoning_gym().factory.DATASETS)
    if name in names:
        return
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    hint = f"; close names: {', '.join(close)}" if close else f"; the datasets: {', '.join(names)}"
    raise ConfigError(f"{spec}: reasoning-gym has no dataset {name!r}{hint}", "tasks")


def _system_prompt(choice: str) -> str | None:
    if choice == "none":
        return None
    prompts: dict[str, str] = reasoning_gym().utils.SYSTEM_PROMPTS
    if choice not in prompts:
        known = ", ".join([*sorted(prompts), "none"])
        raise ConfigError(f"system={choice!r}: reasoning-gym's prompts are {known}", "tasks")
    return prompts[choice]


def _config(name: str, options: dict[str, str], where: str = "") -> dict[str, Any]:
    """``options`` as dataset ``name``'s configuration, each read by its default's type."""
    defaults = _defaults(name)
    config: dict[str, Any] = {}
    for key, text in options.items():
        if key not in defaults:
            known = ", ".join([*sorted(defaults), SYSTEM_OPTION] if not where else sorted(defaults))
            raise ConfigError(
                f"{where}{name} has no option {key!r}; its options are: {known}", "tasks"
            )
        config[key] = _value(f"{where}{key}", text, defaults[key])
    return config


def _composite_config(options: dict[str, str]) -> dict[str, Any]:
    """A composite's ``size`` and ``seed``, and ``datasets`` with each one's weight and options
    (``NAME.weight``, ``NAME.OPTION``)."""
    listed = [n for n in options.pop("datasets", "").split(",") if n]
    if not listed:
        raise ConfigError(
            "composite needs datasets=NAME,NAME (reasoning-gym:composite?datasets=...)", "tasks"
        )
    own: dict[str, str] = {}
    per: dict[str, dict[str, str]] = {name: {} for name in listed}
    for key, text in options.items():
        name, dot, option = key.partition(".")
        if not dot:
            own[key] = text
        elif name in per:
            per[name][option] = text
        else:
            raise ConfigError(f"{key}: {name!r} is not among datasets={','.join(listed)}", "tasks")
    config = _config("composite", own)
    specs = []
    for name in listed:
        _known_dataset(name, f"composite datasets={','.join(listed)}")
        weight = _value(f"{name}.weight", per[name].pop("weight", "1"), 1.0)
        config_of = _config(name, per[name], f"{name}.")
        specs.append({"name": name, "weight": weight, "config": config_of})
    return {**config, "datasets": specs}


def _defaults(name: str) -> dict[str, Any]:
    """Dataset ``name``'s configuration fields and their defaults (None where none is set)."""
    _, config_cls = reasoning_gym().factory.DATASETS[name]
    found: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
        else:
            found[field.name] = None
    if name == "composite":
        found.pop("datasets", None)  # given by datasets=..., never as JSON
    return found


def _value(key: str, text: str, default: Any) -> Any:
    """``text`` as a value of ``default``'s type (JSON, or the text itself, when it has none)."""
    if isinstance(default, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"{key}={text!r}: must be true or false", "tasks")
    if isinstance(default, int | float):
        kind = type(default)
        try:
            return kind(text) if kind is int else float(text)
        except ValueError:
            wanted = "a whole number" if kind is int else "a number"
            raise ConfigError(f"{key}={text!r}: must be {wanted}", "tasks") from None
    if isinstance(default, str):
        return text
    if isinstance(default, tuple | list):
        first = default[0] if default else ""
        return [_value(key, item, first) for item in text.split(",")]
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _digest(name: str, config: dict[str, Any]) -> str:
    """Eight hex digits of what makes the rows, so two specs name the same task only when it
    is the same task. The size too: a few datasets (acre, list_functions) draw other rows at
    another size."""
    text = orjson.dumps({"name": name, **config}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()[:8]
