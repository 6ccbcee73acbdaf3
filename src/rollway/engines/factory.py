"""Build an engine from a URL-like spec.

``embedded`` or ``embedded://PATH`` (a local HF model folder); ``sim`` or
``sim://?latency_s=0.5&per_token_s=0&output_len=16`` (the simulated load generator);
``sglang://HOST:PORT`` (an SGLang server's native API); ``vllm://HOST:PORT`` (a vLLM
OpenAI-compatible server, token ids in and out); several hosts, comma-separated, are routed;
``openai://HOST:PORT[/PATH]?model=NAME`` or ``openai+https://...`` (any chat-completions API,
messages only: for evaluation).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from rollway.engines.base import ChatEngine, Engine
from rollway.engines.remote import RemoteClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError

_SIM_OPTIONS = {"latency_s": float, "per_token_s": float, "output_len": int}


def engine_from_spec(spec: str, *, model: str | None = None) -> Engine | ChatEngine:
    """An engine for ``spec``; ``model`` is the embedded engine's folder when the spec has none.
    Several comma-separated hosts (``sglang://h1:p1,h2:p2``) give a routed engine."""
    scheme, _, rest = spec.partition("://")
    if scheme == "embedded":
        from rollway.engines.embedded import EmbeddedEngine

        return EmbeddedEngine.from_pretrained(rest or model)
    if scheme in ("sglang", "vllm") and rest:
        hosts = [h.strip() for h in rest.split(",") if h.strip()]
        shared = RemoteClient()  # one connection pool for every endpoint
        engines = [_remote(scheme, host, shared) for host in hosts]
        if len(engines) == 1:
            return engines[0]
        from rollway.engines.router import RoutedEngine

        return RoutedEngine(engines, hosts)
    if scheme in ("openai", "openai+https") and rest:
        return _openai(scheme, rest)
    if scheme == "sim":
        return SimEngine(SimConfig(**_sim_options(rest.partition("?")[2])))
    raise ConfigError(
        f"unknown engine spec {spec!r}: expected embedded, sim, sglang://HOST:PORT[,HOST:PORT], "
        "vllm://HOST:PORT[,HOST:PORT] or openai://HOST:PORT?model=NAME",
        "engine",
    )


def _openai(scheme: str, rest: str) -> ChatEngine:
    from rollway.engines.openai_chat import OpenAIChatEngine

    location, _, query = rest.partition("?")
    model = dict(parse_qsl(query)).get("model")
    if not model:
        raise ConfigError("an openai:// engine needs ?model=NAME", "engine")
    host, slash, path = location.partition("/")
    protocol = "https" if scheme == "openai+https" else "http"
    return OpenAIChatEngine(f"{protocol}://{host}/{path if slash else 'v1'}", model=model)


def _remote(scheme: str, host: str, http: RemoteClient) -> Engine:
    if scheme == "sglang":
        from rollway.engines.sglang import SGLangEngine

        return SGLangEngine(f"http://{host}", http=http)
    from rollway.engines.vllm import VLLMEngine

    return VLLMEngine(f"http://{host}", http=http)


def _sim_options(query: str) -> dict[str, float | int]:
    options: dict[str, float | int] = {}
    for key, value in parse_qsl(query):
        if key not in _SIM_OPTIONS:
            known = ", ".join(_SIM_OPTIONS)
            raise ConfigError(f"unknown sim option {key!r}; known: {known}", "engine")
        try:
            options[key] = _SIM_OPTIONS[key](value)
        except ValueError:
            raise ConfigError(f"sim option {key}={value!r} is not a number", "engine") from None
    return options
