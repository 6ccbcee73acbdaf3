"""``rollway view``'s HTTP app: two static pages (assets/, no build step, nothing from a CDN)
over a JSON API. The listing pages over the run's index; a rollout's record is read only for
its own page. Blocking reads run in worker threads. A record that does not read is no error of
the app: the run lists it as unreadable with its reason, and its own page (200) says so."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rollway.errors import BadRecordError, InvalidFieldsError, UnknownRolloutError
from rollway.ids import is_safe_id
from rollway.results import RolloutRecord
from rollway.viewer.record_files import Unreadable
from rollway.viewer.rollout_page import rollout_detail
from rollway.viewer.run_index import (
    COMPONENT_SORT,
    GROUP_COLUMNS,
    ROLLOUT_COLUMNS,
    Query,
    RunIndex,
    RunLocation,
)
from rollway.viewer.token_view import PAGE_TOKENS, TokenTexts, token_page, token_texts
from rollway.web.handlers import JSONResponse, route_error
from rollway.web.openapi import Endpoint, Param, routes_and_document

ASSETS = Path(__file__).parent / "assets"
MAX_PAGE = 500
#: The most unreadable records ``/api/run`` names (the totals count them all).
MAX_UNREADABLE = 200


@dataclass(frozen=True)
class Viewer:
    """What the handlers read: the run, its listing, and the token decoder."""

    location: RunLocation
    index: RunIndex
    texts: TokenTexts

    def record(self, key: str) -> RolloutRecord | Unreadable:
        """The run's record ``key`` (read in a worker thread), or why it does not read;
        unknown keys are a 404."""
        record = self.location.read_record(key) if is_safe_id(key) else None
        if record is None:
            raise UnknownRolloutError(f"no rollout {key!r} in this run")
        return record

    def run_info(self) -> dict[str, Any]:
        return {
            "name": self.location.name,
            "config": self.location.read_config(),
            "totals": self.index.totals(),
            "versions": self.index.versions(),
            "unreadable": [u.as_row() for u in self.index.unreadable()[:MAX_UNREADABLE]],
        }

    def detail(self, key: str) -> dict[str, Any]:
        """The rollout's page; ``{"unreadable": {"key", "reason"}}`` for a record that does
        not read."""
        record = self.record(key)
        if isinstance(record, Unreadable):
            return {"unreadable": record.as_row()}
        group = self.index.group(record.group_id, MAX_PAGE)
        config = self.location.read_config()
        try:
            return rollout_detail(record, self.location, self.texts, config, group)
        except BadRecordError as error:  # read, but its token lists do not line up
            return {"unreadable": Unreadable(key, error.reason).as_row()}

    def tokens(self, key: str, segment: int, offset: int, limit: int) -> dict[str, Any]:
        record = self.record(key)
        if isinstance(record, Unreadable):
            raise UnknownRolloutError(f"rollout {key!r} does not read ({record.reason}): no tokens")
        trajectory = record.trajectory
        try:
            page = token_page(trajectory, segment, offset, limit) if trajectory else None
        except BadRecordError as error:
            reason = error.reason
            raise UnknownRolloutError(
                f"rollout {key!r} does not read ({reason}): no tokens"
            ) from None
        if trajectory is None or page is None:
            raise UnknownRolloutError(f"rollout {key!r} has no segment {segment}")
        model = self.location.read_config().get("model")
        name, found = token_texts(
            self.texts, trajectory, [page], model if isinstance(model, str) else None
        )
        return {**page, "tokenizer": name, "texts": found}


def _viewer(request: Request) -> Viewer:
    viewer: Viewer = request.app.state.viewer
    return viewer


async def run_info(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(_viewer(request).run_info))


async def rollouts(request: Request) -> Response:
    params = request.query_params
    version = params.get("policy_version", "")
    query = Query(
        status=frozenset(s for s in params.get("status", "").split(",") if s),
        group=params.get("group") or None,
        policy_version=_whole("policy_version", version) if version else None,
        text=params.get("q", ""),
        sort=_column(params.get("sort", "task_index"), ROLLOUT_COLUMNS),
        descending=_descending(params.get("order", "asc")),
    )
    offset, limit = _page(params.get("offset", "0"), params.get("limit", "50"))
    index = _viewer(request).index
    return JSONResponse(await run_in_threadpool(index.rollouts, query, offset, limit))


async def groups(request: Request) -> Response:
    params = request.query_params
    sort = _column(params.get("sort", "first_task"), GROUP_COLUMNS)
    descending = _descending(params.get("order", "asc"))
    offset, limit = _page(params.get("offset", "0"), params.get("limit", "50"))
    index = _viewer(request).index
    answer = await run_in_threadpool(
        index.groups, params.get("q", ""), sort, descending, offset, limit
    )
    return JSONResponse(answer)


async def rollout(request: Request) -> Response:
    detail = _viewer(request).detail
    return JSONResponse(await run_in_threadpool(detail, request.path_params["key"]))


async def tokens(request: Request) -> Response:
    params = request.query_params
    segment = _whole("segment", params.get("segment", "0"))
    offset, limit = _whole("offset", params.get("offset", "0")), PAGE_TOKENS
    if "limit" in params:
        limit = _whole("limit", params["limit"])
        if not 1 <= limit <= PAGE_TOKENS:
            raise InvalidFieldsError(f"limit: 1 to {PAGE_TOKENS}", param="limit")
    key = request.path_params["key"]
    page = _viewer(request).tokens
    return JSONResponse(await run_in_threadpool(page, key, segment, offset, limit))


async def listing_page(request: Request) -> Response:
    return FileResponse(ASSETS / "index.html")


async def rollout_page(request: Request) -> Response:
    return FileResponse(ASSETS / "rollout.html")


_PAGE = (
    Param("offset", "query", int, "First row (default 0)"),
    Param("limit", "query", int, f"Rows, 1 to {MAX_PAGE} (default 50)"),
    Param("sort", "query", str, "Column to sort on"),
    Param("order", "query", str, "asc or desc"),
    Param("q", "query", str, "Case-insensitive text filter"),
)
ENDPOINTS = [
    Endpoint(
        "GET",
        "/api/run",
        run_info,
        "The run's name, config, totals, reward and completion per policy version, and the "
        f"records that do not read (key and reason, the first {MAX_UNREADABLE})",
    ),
    Endpoint(
        "GET",
        "/api/rollouts",
        rollouts,
        "A page of rollouts, filtered and sorted, each with its GRPO advantage",
        params=(
            *_PAGE,
            Param("status", "query", str, "Statuses, comma-separated"),
            Param("group", "query", str, "One group id"),
            Param("policy_version", "query", int, "One policy version (the oldest sampled)"),
        ),
        errors=(422,),
    ),
    Endpoint(
        "GET", "/api/groups", groups, "A page of group statistics", params=_PAGE, errors=(422,)
    ),
    Endpoint(
        "GET",
        "/api/rollouts/{key}",
        rollout,
        "One rollout's record, its conversation by segment, its group's rollouts with their "
        "advantages, and the first page of each sample's token stream; for a record that does "
        "not read, only unreadable: its key and the reason",
        errors=(404,),
    ),
    Endpoint(
        "GET",
        "/api/rollouts/{key}/tokens",
        tokens,
        "A page of one sample's token stream",
        params=(
            Param("segment", "query", int, "The sample's segment (default 0)"),
            Param("offset", "query", int, "First token of the stream (default 0)"),
            Param("limit", "query", int, f"Tokens, 1 to {PAGE_TOKENS} (the default)"),
        ),
        errors=(404, 422),
    ),
]


def create_viewer_app(
    location: RunLocation, *, tokenizer: str | None = None, index: RunIndex | None = None
) -> Starlette:
    """The viewer over ``location``; ``tokenizer`` (a folder or hub id) overrides the model's."""
    routes = routes_and_document(
        ENDPOINTS,
        title="rollway view",
        description="A run's rollouts, for the viewer's pages.",
        security={},
    )
    app = Starlette(
        routes=[
            *routes,
            Route("/", listing_page, methods=["GET"]),
            Route("/rollouts/{key}", rollout_page, methods=["GET"]),
            Mount("/assets", StaticFiles(directory=ASSETS), name="assets"),
        ],
        exception_handlers={HTTPException: route_error},
    )
    app.state.viewer = Viewer(location, index or RunIndex(location), TokenTexts(tokenizer))
    return app


def _column(name: str, allowed: frozenset[str]) -> str:
    if name.startswith(COMPONENT_SORT) and name != COMPONENT_SORT:
        return name  # a reward component's column (a group's: its mean): one without it last
    if name not in allowed:
        raise InvalidFieldsError(f"sort: one of {', '.join(sorted(allowed))}", param="sort")
    return name


def _descending(order: str) -> bool:
    if order not in ("asc", "desc"):
        raise InvalidFieldsError("order: asc or desc", param="order")
    return order == "desc"


def _page(offset: str, limit: str) -> tuple[int, int]:
    first = _whole("offset", offset)
    if not 1 <= _whole("limit", limit) <= MAX_PAGE:
        raise InvalidFieldsError(f"limit: a whole number from 1 to {MAX_PAGE}", param="limit")
    return first, int(limit)


#: The most digits a number in a query may have: far past any run, well within JSON's integers.
MAX_DIGITS = 15


def _whole(name: str, value: str) -> int:
    """A whole number from 0 written in ASCII digits (``str.isdigit`` alone takes ``²`` and
    Arabic-Indic digits)."""
    if not (value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS):
        raise InvalidFieldsError(
            f"{name}: a whole number from 0, at most {MAX_DIGITS} digits", param=name
        )
    return int(value)
