"""OpenAPI documents for rollway's servers, built from the same declarations as their routes.

Each app lists ``Endpoint``s (method, path, handler, and the pydantic model of its body); its
routes and its ``/openapi.json`` both come from that list, and every schema in the document is
generated from the wire models that validate requests, so the document cannot drift from the
code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, TypeAdapter
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollway.web.handlers import Handler, JSONResponse, guarded

_REF = "#/components/schemas/{model}"
_REASONS = {
    400: "Malformed JSON",
    401: "Wrong or missing key",
    404: "Unknown rollout",
    409: "Conflict (cancelled, already registered, idempotency key reused)",
    413: "Body too large",
    422: "Invalid fields; the message names the field",
    429: "At capacity; see Retry-After",
    502: "The engine failed",
    503: "The engine cannot be reached (an outage): nothing was sent",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error rollway answers, in OpenAI's error shape."""

    error: ErrorDetail


class ServerSentEvent(BaseModel):
    """One event of a streamed answer (``text/event-stream``), in the shape OpenAPI 3.2's
    ``itemSchema`` gives server-sent events: an ``event:`` line and a ``data:`` line."""

    event: str | None = Field(
        default=None,
        description="The event's name, where the API names its events (Anthropic Messages: "
        "message_start, content_block_delta...; Responses: response.output_text.delta...); "
        "chat completions name none.",
    )
    data: str = Field(
        description="A JSON object: a chunk of the answer, or the API's error object for an "
        "error after the stream began. A chat-completions stream ends with [DONE]."
    )


@dataclass(frozen=True)
class Param:
    """A query or header parameter; ``schema`` is a type pydantic can describe."""

    name: str
    where: Literal["query", "header"]
    schema: Any
    description: str = ""


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    #: The security scheme it needs (a name in the document's ``securitySchemes``), if any.
    auth: str | None = None
    #: Path parameters' types, by name (default: a plain string).
    path_types: dict[str, Any] = field(default_factory=dict)
    params: tuple[Param, ...] = ()
    #: The error statuses it answers besides 401 (when it has ``auth``) and 404/405 routing.
    errors: tuple[int, ...] = ()
    #: The success answer's model; None documents a JSON object.
    answer: type[BaseModel] | None = None
    status: int = 200
    #: Also answers ``text/event-stream`` when the body asks to stream.
    streams: bool = False
    #: The success answer's media type; anything but JSON is documented as text.
    media_type: str = "application/json"

    def route(self) -> Route:
        return Route(self.path, guarded(self.handler), methods=[self.method])


def routes_and_document(
    endpoints: Sequence[Endpoint],
    *,
    title: str,
    description: str,
    security: dict[str, str],
) -> list[Route]:
    """The endpoints' routes plus ``GET /openapi.json`` serving their document;
    ``security`` maps each scheme name to what the key is."""
    document = openapi_document(endpoints, title=title, description=description, security=security)

    async def serve(request: Request) -> Response:
        return JSONResponse(document)

    return [*(e.route() for e in endpoints), Route("/openapi.json", serve, methods=["GET"])]


def openapi_document(
    endpoints: Sequence[Endpoint], *, title: str, description: str, security: dict[str, str]
) -> dict[str, Any]:
    bodies = {e.body for e in endpoints if e.body}
    models: set[type[BaseModel]] = {ErrorBody, ServerSentEvent, *bodies, *_answers(endpoints)}
    refs, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=_REF
    )
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation = _operation(endpoint, refs)
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    schemes = {
        name: {"type": "http", "scheme": "bearer", "description": what}
        for name, what in security.items()
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": description},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {}), "securitySchemes": schemes},
    }


def _answers(endpoints: Iterable[Endpoint]) -> set[type[BaseModel]]:
    return {e.answer for e in endpoints if e.answer is not None}


def _operation(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    content = {endpoint.media_type: {"schema": _answer_schema(endpoint, refs)}}
    if endpoint.streams:
        # OpenAPI 3.1 has no schema for a stream of items (3.2's ``itemSchema``): the events
        # in order, as an array of them, is the nearest.
        events = {"type": "array", "items": refs[(ServerSentEvent, "validation")]}
        content["text/event-stream"] = {"schema": events}
    error = {"application/json": {"schema": refs[(ErrorBody, "validation")]}}
    statuses = sorted({*endpoint.errors, *((401,) if endpoint.auth else ())})
    responses: dict[str, Any] = {str(endpoint.status): {"description": "OK", "content": content}}
    for status in statuses:
        responses[str(status)] = {"description": _REASONS[status], "content": error}
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": f"{endpoint.method.lower()}{endpoint.path}",
        "parameters": [*_path_params(endpoint), *map(_param, endpoint.params)],
        "responses": responses,
    }
    if endpoint.auth:
        operation["security"] = [{endpoint.auth: []}]
    if endpoint.body is not None:
        body = {"application/json": {"schema": refs[(endpoint.body, "validation")]}}
        required = any(f.is_required() for f in endpoint.body.model_fields.values())
        operation["requestBody"] = {"required": required, "content": body}
    return operation


def _answer_schema(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    if endpoint.answer is not None:
        return refs[(endpoint.answer, "validation")]
    return {"type": "object"} if endpoint.media_type == "application/json" else {"type": "string"}


def _path_params(endpoint: Endpoint) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in endpoint.path.split("/") if part.startswith("{")]
    return [
        {"name": n, "in": "path", "required": True, "schema": _schema(endpoint.path_types.get(n))}
        for n in names
    ]


def _param(param: Param) -> dict[str, Any]:
    return {
        "name": param.name,
        "in": param.where,
        "required": False,
        "description": param.description,
        "schema": _schema(param.schema),
    }


def _schema(kind: Any) -> dict[str, Any]:
    return TypeAdapter(kind if kind is not None else str).json_schema()
