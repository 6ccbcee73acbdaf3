"""Build an engine from a URL-like spec.

``embedded`` or ``embedded://PATH`` (a local HF model folder); ``sim`` or
``sim://?latency_s=0.5&per_token_s=0&output_len=16`` (the simulated load generator);
``sglang://HOST:PORT`` (an SGLang server's native API); ``vllm://HOST:PORT`` (a vLLM
OpenAI-compatible server, token ids in and out); several hosts, comma-separated, are routed
(``sglang://h1:p1,h2:p2``; each host may repeat the scheme, ``sglang://h1:p1,sglang://h2:p2``);
``openai://HOST:PORT[/PATH]?model=NAME`` or ``openai+https://...`` (any chat-completions API,
messages only: for evaluation).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

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
        hosts = _fleet(scheme, rest, spec)
        if len(hosts) == 1:
            return _remote(scheme, hosts[0], RemoteClient())
        from rollway.engines.router import RoutedEngine

        # One connection pool for every endpoint; the router, not the pool, retries a refused
        # connect (on another endpoint).
        shared = RemoteClient(connect_attempts=1)
        return RoutedEngine([_remote(scheme, host, shared) for host in hosts], hosts)
    if scheme in ("openai", "openai+https") and rest:
        return _openai(scheme, rest)
    if scheme == "sim":
        return SimEngine(SimConfig(**_sim_options(rest.partition("?")[2])))
    raise ConfigError(
        f"unknown engine spec {spec!r}: expected embedded, sim, sglang://HOST:PORT[,HOST:PORT], "
        "vllm://HOST:PORT[,HOST:PORT] or openai://HOST:PORT?model=NAME",
        "engine",
    )


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
