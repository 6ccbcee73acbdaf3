"""Build an engine from a URL-like spec. ``ENGINES`` is the one list of schemes: each row's
builder, options and help, from which the refusal of an unknown spec and the CLI's ``--engine``
help are made (adding an engine is one row).

``embedded`` or ``embedded://PATH`` (a local HF model folder), with
``?prefix_cache_tokens=N`` for its prefix cache's budget (0: none), ``?dtype=bfloat16`` for
its weights (float32 by default; float16 on a GPU only) and ``?context_length=N`` (a context
shorter than the model's, as vLLM's ``--max-model-len``); ``sim`` or
``sim://?latency_s=0.5&per_token_s=0&output_len=16`` (the simulated load generator);
``sglang://HOST:PORT`` (an SGLang server's native API); ``vllm://HOST:PORT`` (a vLLM
OpenAI-compatible server, token ids in and out); several hosts, comma-separated, are routed
(``sglang://h1:p1,h2:p2``; each host may repeat the scheme, ``sglang://h1:p1,sglang://h2:p2``);
``openai://HOST:PORT[/PATH]?model=NAME`` or ``openai+https://...`` (any chat-completions API,
messages only: for evaluation); ``scripted://FILE`` (answers the completions listed in FILE,
in order, encoded with the model folder's tokenizer: ``engines/scripted.py``).

Options follow the hosts, for every host: ``?api_key=KEY`` for servers started with
``--api-key`` (else ``ROLLWAY_ENGINE_API_KEY``; the environment keeps a key out of specs, which
get copied around; a spec in an error message shows ``api_key=***``); for ``sglang://`` also
``context_length=N``, ``default_max_tokens=N`` and ``original_logprobs=1`` (the server runs with
``SGLANG_RETURN_ORIGINAL_LOGPROB=1``), see ``engines/remote/sglang.py``; for ``vllm://`` also
``context_length=N``, ``default_max_tokens=N`` and ``logprobs_mode=raw_logprobs|processed_logprobs``
(the server's ``--logprobs-mode``), see ``engines/remote/vllm.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from rollway.engines.base import ChatEngine, Engine
from rollway.engines.remote.connection import RemoteClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError

#: The API key of remote engine servers, when the spec gives none.
API_KEY_ENV = "ROLLWAY_ENGINE_API_KEY"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """A spec taken apart: ``SCHEME://LOCATION?OPTIONS``, the options checked and converted."""

    scheme: str
    location: str
    options: dict[str, Any]
    #: The ``--model`` folder, for engines whose spec names none.
    model: str | None
    #: The spec as messages show it (``api_key=***``).
    shown: str


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One row of ``ENGINES``."""

    #: The schemes that name it (``openai+https`` is ``openai`` over TLS).
    schemes: tuple[str, ...]
    build: Callable[[EngineSpec], Engine | ChatEngine]
    #: Each option the query may give, with its conversion (a ValueError: not that kind).
    options: Mapping[str, Callable[[str], Any]]
    #: The spec's form, as ``--engine``'s help and the refusal of an unknown spec show it.
    help: str
    #: False where the scheme alone (``embedded``, ``sim``) is a whole spec.
    needs_location: bool = True


def _flag(value: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ValueError(value)


def _embedded(spec: EngineSpec) -> Engine:
    from rollway.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.from_pretrained(spec.location or spec.model, **spec.options)


def _sim(spec: EngineSpec) -> Engine:
    return SimEngine(SimConfig(**spec.options))


def _sglang_server(url: str, http: RemoteClient, options: dict[str, Any]) -> Engine:
    from rollway.engines.remote.sglang import SGLangEngine

    return SGLangEngine(url, http=http, **options)


def _vllm_server(url: str, http: RemoteClient, options: dict[str, Any]) -> Engine:
    from rollway.engines.remote.vllm import VLLMEngine

    return VLLMEngine(url, http=http, **options)


def _servers(
    server: Callable[[str, RemoteClient, dict[str, Any]], Engine],
) -> Callable[[EngineSpec], Engine]:
    """A builder of ``server`` engines: one per comma-separated host, routed when several."""

    def build(spec: EngineSpec) -> Engine:
        options = dict(spec.options)
        key = options.pop("api_key", None) or os.environ.get(API_KEY_ENV) or None
        hosts = _fleet(spec.scheme, spec.location, spec.shown)
        if len(hosts) == 1:
            return server(f"http://{hosts[0]}", RemoteClient(bearer=key), options)
        from rollway.engines.remote.router import RoutedEngine

        # One connection pool for every endpoint; the router, not the pool, retries a refused
        # connect (on another endpoint).
        shared = RemoteClient(connect_attempts=1, bearer=key)
        return RoutedEngine([server(f"http://{host}", shared, options) for host in hosts], hosts)

    return build


def _openai(spec: EngineSpec) -> ChatEngine:
    from rollway.engines.remote.openai_chat import OpenAIChatEngine

    if not spec.options.get("model"):
        raise ConfigError("an openai:// engine needs ?model=NAME", "engine")
    host, slash, path = spec.location.partition("/")
    protocol = "https" if spec.scheme == "openai+https" else "http"
    return OpenAIChatEngine(f"{protocol}://{host}/{path if slash else 'v1'}", **spec.options)


def _scripted(spec: EngineSpec) -> Engine:
    from rollway.engines.scripted import ScriptedEngine

    return ScriptedEngine.from_file(spec.location, _folder_tokenizer(spec.model))


_SERVER_OPTIONS: dict[str, Callable[[str], Any]] = {
    "api_key": str,
    "context_length": int,
    "default_max_tokens": int,
}

#: Every engine a spec can name, in the order help lists them.
ENGINES: tuple[EngineKind, ...] = (
    EngineKind(
        ("embedded",),
        _embedded,
        {"prefix_cache_tokens": int, "dtype": str, "context_length": int},
        "embedded[://?prefix_cache_tokens=N&dtype=bfloat16]",
        needs_location=False,
    ),
    EngineKind(
        ("sim",),
        _sim,
        {"latency_s": float, "per_token_s": float, "output_len": int},
        "sim://",
        needs_location=False,
    ),
    EngineKind(
        ("sglang",),
        _servers(_sglang_server),
        {**_SERVER_OPTIONS, "original_logprobs": _flag},
        "sglang://HOST:PORT",
    ),
    EngineKind(
        ("vllm",),
        _servers(_vllm_server),
        {**_SERVER_OPTIONS, "logprobs_mode": str},
        "vllm://HOST:PORT",
    ),
    EngineKind(("openai", "openai+https"), _openai, {"model": str}, "openai://HOST:PORT?model=M"),
    EngineKind(
        ("scripted",),
        _scripted,
        {},
        "scripted://FILE (the completions listed in FILE, tokenized by --model's tokenizer)",
    ),
)


def engine_help() -> str:
    """The forms of every spec, as ``--engine``'s help lists them."""
    return " | ".join(kind.help for kind in ENGINES)


def engine_from_spec(spec: str, *, model: str | None = None) -> Engine | ChatEngine:
    """An engine for ``spec``; ``model`` is the embedded engine's folder when the spec has none.
    Several comma-separated hosts (``sglang://h1:p1,h2:p2``) give a routed engine."""
    scheme, _, rest = spec.partition("://")
    kind = next((kind for kind in ENGINES if scheme in kind.schemes), None)
    if kind is None or (kind.needs_location and not rest):
        message = f"unknown engine spec {redact(spec)!r}: expected one of {engine_help()}"
        raise ConfigError(message, "engine")
    location, _, query = rest.partition("?")
    options = _options(query, kind.options, f"{scheme}:// option")
    return kind.build(EngineSpec(scheme, location, options, model, redact(spec)))


def _folder_tokenizer(model: str | None) -> Any:
    """The tokenizer of ``model``'s folder (default: SmolLM2's)."""
    from transformers import AutoTokenizer

    from rollway.model_folders import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model))


def redact(spec: str) -> str:
    """``spec`` with its API key hidden, for messages and logs."""
    return re.sub(r"(api_key=)[^&]*", r"\1***", spec)


def _fleet(scheme: str, rest: str, spec: str) -> list[str]:
    """The ``HOST:PORT`` of each comma-separated server, checked; ``SCHEME://`` may lead each."""
    hosts: list[str] = []
    servers: set[tuple[str, int | None]] = set()
    for item in rest.split(","):
        own, sep, host = item.strip().rpartition("://")
        if sep and own != scheme:
            raise ConfigError(
                f"engine spec {spec!r} mixes {scheme}:// with {own}://: "
                "a routed fleet is one kind of server",
                "engine",
            )
        server = _check_host(host, spec)
        if server in servers:  # spelt differently (A:1, a:01), still one server
            raise ConfigError(f"engine spec {spec!r} lists {host} twice", "engine")
        servers.add(server)
        hosts.append(host)
    return hosts


def _check_host(host: str, spec: str) -> tuple[str, int | None]:
    """The server ``host`` names, normalised (host name lower-cased, port as a number)."""
    expected = "expected HOST:PORT[,HOST:PORT...]"
    if not host:
        raise ConfigError(f"engine spec {spec!r} has an empty host: {expected}", "engine")
    try:
        parts = urlsplit(f"http://{host}")
        parts.port  # noqa: B018 (raises ValueError when the port is not a number in range)
    except ValueError as exc:
        raise ConfigError(f"bad host {host!r} in engine spec {spec!r}: {exc}", "engine") from None
    if not parts.hostname or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"bad host {host!r} in engine spec {spec!r}: {expected}", "engine")
    return parts.hostname, parts.port


def _options(query: str, known: Mapping[str, Callable[[str], Any]], what: str) -> dict[str, Any]:
    """The ``key=value`` options of a spec's query, each checked and converted."""
    try:
        # Blank values kept: ``?prefix_cache_tokens=`` is a mistake to name, not to drop.
        pairs = parse_qsl(query, strict_parsing=True, keep_blank_values=True) if query else []
    except ValueError:
        message = f"bad {what}s {redact(query)!r}: expected key=value&..."
        raise ConfigError(message, "engine") from None
    options: dict[str, Any] = {}
    for key, value in pairs:
        if key not in known:
            names = ", ".join(known) or "none"
            raise ConfigError(f"unknown {what} {key!r}; known: {names}", "engine")
        try:
            options[key] = known[key](value)
        except ValueError:
            kinds: dict[Callable[[str], Any], str] = {int: "a whole number", float: "a number"}
            kind = kinds.get(known[key], "1 or 0")
            raise ConfigError(f"{what} {key}={value!r} is not {kind}", "engine") from None
    return options
