"""Traces across the flow, with OpenTelemetry: off by default, free when off.

Spans: ``rollway.rollout`` (one attempt, in the client's runner), ``rollway.agent.run`` (a
rollout on an agent server), ``rollway.gateway.turn`` (one chat call) and
``rollway.engine.request`` (one engine generation). The W3C ``traceparent`` header carries the
trace across HTTP (rollway's own calls send it, its servers read it) and the ``TRACEPARENT``
environment variable into program agents. A turn whose request carries no trace context joins
the trace its rollout was registered under, so an uninstrumented program's turns still sit
under their rollout.

``enable()`` (or ``RolloutClient(trace=True)``, ``rollway run --trace``, ``ROLLWAY_TRACE=1``)
turns tracing on in this process; it needs the ``otel`` extra. Until then nothing here imports
``opentelemetry`` and each hook costs one check.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from rollway.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: The tracer once ``enable`` ran; None means off (the one check every hook makes).
_tracer: Tracer | None = None
#: Its provider, whose buffered spans ``flush`` exports.
_provider: Any = None
#: Environment variables that hand trace context to a child process (OpenTelemetry's
#: environment carrier: the W3C header names, upper-cased).
_ENV_CARRIER = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}
_TRUE = {"1", "true", "yes", "on"}


class SpanHandle:
    """What ``span`` yields: attributes to add as the work ends, and a way to mark it failed.
    When tracing is off it is ``NO_SPAN``, which does nothing."""

    __slots__ = ("_span",)

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def set(self, attributes: Mapping[str, Any]) -> None:
        if self._span is not None:
            self._span.set_attributes(_clean(attributes))

    def fail(self, description: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description))


NO_SPAN = SpanHandle(None)
_OFF = contextlib.nullcontext(NO_SPAN)


def enabled() -> bool:
    return _tracer is not None


def enable(provider: TracerProvider | None = None) -> None:
    """Trace this process's rollouts, turns and engine requests.

    Spans go to ``provider`` when given; else to the global tracer provider when the
    application set one up; else to a new SDK provider, made global, exporting as the
    standard variables say: ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, over HTTP to
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``; ``none``), ``OTEL_SERVICE_NAME`` (default
    ``rollway``), ``OTEL_RESOURCE_ATTRIBUTES``. ``OTEL_SDK_DISABLED=true`` leaves tracing off.
    """
    global _tracer, _provider
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConfigError(
            "tracing needs OpenTelemetry: pip install 'rollway[otel]'", "trace"
        ) from exc
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            provider = _provider_from_env()
            trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("rollway")
    _provider = provider


def enable_if(asked: bool) -> None:
    """``enable()`` when ``asked`` or when ``ROLLWAY_TRACE`` is set to a true value."""
    if asked or os.environ.get("ROLLWAY_TRACE", "").strip().lower() in _TRUE:
        enable()


def disable() -> None:
    """Stop making spans in this process (the provider stays as it is)."""
    global _tracer
    _tracer = None


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered: a server shutting down calls it, since a server that
    ends on a signal may never run ``atexit`` (where the SDK flushes on its own)."""
    force_flush = getattr(_provider, "force_flush", None)  # the SDK's; the bare API has none
    if _tracer is not None and force_flush is not None:
        force_flush(int(timeout_s * 1000))


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: Context | None = None,
) -> contextlib.AbstractContextManager[SpanHandle]:
    """A span around the block, the current one's child. ``parent`` is used only when no
    span is current (the trace a rollout was registered under, for a turn that came without
    trace context). Exceptions are recorded on it."""
    if _tracer is None:
        return _OFF
    return _started(_tracer, name, attributes or {}, parent)


@contextlib.contextmanager
def _started(
    tracer: Tracer,
    name: str,
    attributes: Mapping[str, Any],
    parent: Context | None,
    *,
    current: bool = True,
) -> Iterator[SpanHandle]:
    """The span, a child of the current one (of ``parent`` where none is current), ended with
    the block, an exception recorded on it; the current span in the block if ``current``."""
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    context = None
    if parent is not None and not trace.get_current_span().get_span_context().is_valid:
        context = parent
    started = tracer.start_span(name, context, attributes=_clean(attributes))
    entered = (
        trace.use_span(started, record_exception=False, set_status_on_exception=False)
        if current
        else contextlib.nullcontext()
    )
    try:
        with entered:
            yield SpanHandle(started)
    except Exception as exc:  # as OpenTelemetry does: a cancellation is not a failure
        started.record_exception(exc)
        started.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        started.end()


def detached_span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: Context | None = None,
) -> contextlib.AbstractContextManager[SpanHandle]:
    """``span`` for a block that yields to others (an async generator handing out a stream):
    the span is a child as ``span``'s is but never becomes the current one, since a context
    attached before a ``yield`` may be detached in another task's context after it."""
    if _tracer is None:
        return _OFF
    return _started(_tracer, name, attributes or {}, parent, current=False)


def annotate(attributes: Mapping[str, Any]) -> None:
    """Add attributes to the current span (an engine client naming the endpoint it used)."""
    if _tracer is not None:
        from opentelemetry import trace

        trace.get_current_span().set_attributes(_clean(attributes))


def current_context() -> Context | None:
    """The trace context here, to parent later work that runs elsewhere (None when off)."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return context.get_current()


def headers(base: dict[str, str]) -> dict[str, str]:
    """A copy of ``base`` plus ``traceparent`` (and ``tracestate``) for an outgoing HTTP
    request; ``base`` itself, unchanged, when tracing is off."""
    if _tracer is None:
        return base
    from opentelemetry import propagate

    carrier = dict(base)
    propagate.inject(carrier)
    return carrier


def child_env() -> dict[str, str]:
    """Environment variables that put a child process in the current trace: ``TRACEPARENT``
    (``TRACESTATE``), and this process's ``OTEL_*`` settings so that it exports where this
    process does. Empty when tracing is off."""
    if _tracer is None:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    env.update({_ENV_CARRIER[k]: v for k, v in carrier.items() if k in _ENV_CARRIER})
    return env


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class TraceContextMiddleware:
    """ASGI middleware: a request's ``traceparent`` becomes the current trace context while
    its handler runs (and in the tasks it starts); a request without one runs outside any
    trace. Passes requests straight through when tracing is off."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if _tracer is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate", b"baggage")
        }
        from opentelemetry import context, propagate

        # Always attached, empty when the request names no trace: a request never inherits
        # whatever span the server's own task happened to start under.
        token = context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)


def _provider_from_env() -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # From OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; "rollway" where they name none.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "rollway"}))
    provider = TracerProvider(resource=resource)
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip().lower()
        if name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as exc:
                raise ConfigError(
                    "OTLP export needs opentelemetry-exporter-otlp-proto-http: "
                    "pip install 'rollway[otel]'",
                    "OTEL_TRACES_EXPORTER",
                ) from exc
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name not in ("none", ""):
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={name!r}: rollway exports otlp, console or none",
                "OTEL_TRACES_EXPORTER",
            )
    return provider


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes no None values: an attribute not known yet is left out."""
    return {key: value for key, value in attributes.items() if value is not None}
