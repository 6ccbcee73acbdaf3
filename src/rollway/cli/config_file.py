"""A command's settings from a TOML file (``--config run.toml``), under what the command line
and the environment say, and the merged result back as TOML (``--print-config``).

The file holds the command's own option names (``group_size = 4`` or ``group-size = 4``, ``stop
= ["</answer>"]``, ``agent = "examples/calculator/agent.py:CalculatorAgent"``), each checked
as the option would be. Precedence: the command line, then the environment, then the file,
then the option's default.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from rollway.errors import ConfigError, InvalidFieldsError

#: Options about the file itself, never settings in it.
OWN_OPTIONS = frozenset({"config", "print_config"})
#: Settings never printed: keys.
SECRETS = frozenset({"agent_key", "gateway_key"})
#: Where a value came from that wins over the file (click's ``ParameterSource`` names: Typer
#: ships its own copy of click, so the enum is compared by name).
GIVEN = frozenset({"COMMANDLINE", "ENVIRONMENT"})


def merged_settings(ctx: Any, path: Path | None) -> dict[str, Any]:
    """The command's parameters, with the file's settings wherever neither the command line
    nor the environment set one."""
    settings = {k: v for k, v in ctx.params.items() if k not in OWN_OPTIONS}
    if path is None:
        return settings
    params = {p.name: p for p in ctx.command.params if p.name not in OWN_OPTIONS}
    for key, value in _read(path).items():
        name = key.replace("-", "_")
        param = params.get(name)
        if param is None:
            known = ", ".join(sorted(n for n in params if n))
            raise ConfigError(f"{path}: unknown setting {key!r}; the settings are: {known}")
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in GIVEN:
            continue  # the command line and the environment win over the file
        _check_kind(param, value, f"{path}: {key}")
        try:
            settings[name] = _file_value(ctx, param, value)
        except InvalidFieldsError as exc:  # a declared setting's own refusal, naming it
            raise ConfigError(f"{path}: {exc.message}", param=name) from None
        except Exception as exc:  # click's BadParameter, from Typer's copy of click
            if not hasattr(exc, "format_message"):
                raise
            raise ConfigError(f"{path}: {key}: {exc.format_message()}", param=name) from None
    return settings


#: What a TOML value must be for an option of each type, and how to say it: the option's own
#: conversion takes strings (it reads a command line), so it would turn ``"3"`` or ``true`` into
#: 3 or 1 and ``1`` or ``"yes"`` into true; a file has typed values, and another type is a mistake.
_TOML_KINDS: dict[Any, tuple[tuple[type, ...], str]] = {
    int: ((int,), "a whole number"),
    float: ((int, float), "a number"),
    bool: ((bool,), "true or false"),
}


def _check_kind(param: Any, value: Any, where: str) -> None:
    """Refuse a TOML ``value`` whose type is not the option's (``ConfigError`` naming it); an
    option made from a declared setting (``run_options.SettingParser``) refuses by its rule."""
    _check_shape(param, value, where)
    if _declared(param) is not None:
        return  # checked as it is, by its rule (``_file_value``)
    descriptor = getattr(param, "type_descriptor", None)
    kinds, wanted = _TOML_KINDS.get(getattr(descriptor, "annotation", None), ((), ""))
    if not kinds or (isinstance(value, kinds) and isinstance(value, bool) == (bool in kinds)):
        return
    raise ConfigError(
        f"{where}: must be {wanted}, not {type(value).__name__} {value!r}", param=param.name
    )


def _declared(param: Any) -> Any:
    """The option's parser where it is made from a declared setting (it has ``check_typed``,
    which checks a typed value as it is, where the option's conversion would read text)."""
    descriptor = getattr(param, "type_descriptor", None)
    parser = getattr(getattr(descriptor, "parameter_info", None), "parser", None)
    return parser if hasattr(parser, "check_typed") else None


def _file_value(ctx: Any, param: Any, value: Any) -> Any:
    """A file's ``value`` converted and checked as the option's would be."""
    declared = _declared(param)
    return declared.check_typed(value) if declared else param.process_value(ctx, value)


def _check_shape(param: Any, value: Any, where: str) -> None:
    """No option takes a table, and only a repeatable one (``stop``) takes a list, of plain
    values: the option's conversion would make ``{'x': 1}`` of a table, or of a list."""
    items = value if isinstance(value, list) and param.multiple else [value]
    for item in items:
        if isinstance(item, dict | list):
            kind = "a table" if isinstance(item, dict) else "a list"
            wanted = "a list of plain values" if param.multiple else "one plain value"
            raise ConfigError(
                f"{where}: must be {wanted} (a string, number or boolean), not {kind}; "
                "settings are plain keys before any [section]",
                param=param.name,
            )


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config file {path}", param="config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not TOML: {exc}", param="config") from None


def as_toml(settings: dict[str, Any]) -> str:
    """``settings`` as a config file would hold them; unset ones (None) as comments, since
    TOML has no null, and keys as comments that say they are set."""
    lines = []
    for name in sorted(settings):
        value = settings[name]
        if value is None or value == ():
            lines.append(f"# {name} = (not set)")
            continue
        if name in SECRETS:
            lines.append(f"# {name} = (set, not shown)")
            continue
        if isinstance(value, list | tuple):
            value = [_plain(v) for v in value]
        lines.append(tomli_w.dumps({name: _plain(value)}).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value
