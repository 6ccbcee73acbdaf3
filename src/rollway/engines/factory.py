"""Build an engine from a URL-like spec.

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
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from rollway.engines.base import ChatEngine, Engine
from rollway.engines.remote.connection import RemoteClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError

#: The API key of remote engine servers, when the spec gives none.
API_KEY_ENV = "ROLLWAY_ENGINE_API_KEY"


def _flag(value: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ValueError(value)


_EMBEDDED_OPTIONS: dict[str, Callable[[str], Any]] = {
    "prefix_cache_tokens": int,
    "dtype": str,
    "context_length": int,
}
_SIM_OPTIONS: dict[str, Callable[[str], Any]] = {
    "latency_s": float,
    "per_token_s": float,
    "output_len": int,
}
_REMOTE_OPTIONS: dict[str, dict[str, Callable[[str], Any]]] = {
    "sglang": {
        "api_key": str,
        "context_length": int,
        "default_max_tokens": int,
        "original_logprobs": _flag,
    },
    "vllm": {
        "api_key": str,
        "context_length": int,
        "default_max_tokens": int,
        "logprobs_mode": str,
    },
}


def engine_from_spec(spec: str, *, model: str | None = None) -> Engine | ChatEngine:
    """An engine for ``spec``; ``model`` is the embedded engine's folder when the spec has none.
    Several comma-separated hosts (``sglang://h1:p1,h2:p2``) give a routed engine."""
    scheme, _, rest = spec.partition("://")
    if scheme == "embedded":
        from rollway.engines.embedded import EmbeddedEngine

        location, _, query = rest.partition("?")
        options = _options(query, _EMBEDDED_OPTIONS, "embedded:// option")
        return EmbeddedEngine.from_pretrained(location or model, **options)
    if scheme in ("sglang", "vllm") and rest:
        shown = redact(spec)
        location, _, query = rest.partition("?")
        options = _options(query, _REMOTE_OPTIONS[scheme], f"{scheme}:// option")
        key = options.pop("api_key", None) or os.environ.get(API_KEY_ENV) or None
        hosts = _fleet(scheme, location, shown)
        if len(hosts) == 1:
            return _remote(scheme, hosts[0], RemoteClient(bearer=key), options)
        from rollway.engines.remote.router import RoutedEngine

        # One connection pool for every endpoint; the router, not the pool, retries a refused
        # connect (on another endpoint).
        shared = RemoteClient(connect_attempts=1, bearer=key)
        return RoutedEngine([_remote(scheme, host, shared, options) for host in hosts], hosts)
    if scheme in ("openai", "openai+https") and rest:
        return _openai(scheme, rest)
    if scheme == "scripted" and rest:
        from rollway.engines.scripted import ScriptedEngine

        return ScriptedEngine.from_file(rest, _folder_tokenizer(model))
    if scheme == "sim":
        return SimEngine(SimConfig(**_options(rest.partition("?")[2], _SIM_OPTIONS, "sim option")))
    raise ConfigError(
        f"unknown engine spec {redact(spec)!r}: expected embedded, sim, "
        "sglang://HOST:PORT[,HOST:PORT], vllm://HOST:PORT[,HOST:PORT], "
        "openai://HOST:PORT?model=NAME or scripted://FILE",
        "engine",
    )


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


def _openai(scheme: str, rest: str) -> ChatEngine:
    from rollway.engines.remote.openai_chat import OpenAIChatEngine

    location, _, query = rest.partition("?")
    model = dict(parse_qsl(query)).get("model")
    if not model:
        raise ConfigError("an openai:// engine needs ?model=NAME", "engine")
    host, slash, path = location.partition("/")
    protocol = "https" if scheme == "openai+https" else "http"
    return OpenAIChatEngine(f"{protocol}://{host}/{path if slash else 'v1'}", model=model)


def _remote(scheme: str, host: str, http: RemoteClient, options: dict[str, Any]) -> Engine:
    if scheme == "sglang":
        from rollway.engines.remote.sglang import SGLangEngine

        return SGLangEngine(f"http://{host}", http=http, **options)
    from rollway.engines.remote.vllm import VLLMEngine

    return VLLMEngine(f"http://{host}", http=http, **options)


def _options(query: str, known: dict[str, Callable[[str], Any]], what: str) -> dict[str, Any]:
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
            names = ", ".join(known)
            raise ConfigError(f"unknown {what} {key!r}; known: {names}", "engine")
        try:
            options[key] = known[key](value)
        except ValueError:
            kinds: dict[Callable[[str], Any], str] = {int: "a whole number", float: "a number"}
            kind = kinds.get(known[key], "1 or 0")
            raise ConfigError(f"{what} {key}={value!r} is not {kind}", "engine") from None
    return options
