"""Fencing: a segment the driver gave up on writes nothing more to its trial's MLflow run.

When a warm node drops off the network mid-segment, the driver relaunches the segment on a
live node from the trial's last checkpoint (flows/warm_pool.py). The node it gave up on may
still be training: its link may come back, and with it writes the driver no longer expects
(metrics logged twice, a checkpoint or report that overwrites the relaunch's). So each
launch of a segment carries a token, ``<segment start>/<launch time, ms>/<attempt>``, and
every write its process makes to MLflow carries it in the header :data:`HEADER`. When the
driver gives up on a launch, it sets the trial run's tag :data:`TAG` to a fence,
``<start>/<now, ms>/0``, before it launches again; the tracking server (:func:`create_app`,
``mlflow server --app-name elastune-fenced``: MLflow's basic-auth app with the fence in
front) refuses with 409 any write to that run whose token orders before the tag. Tokens
order by (start, time): a trial's later segments start later, and a relaunch is launched
after its fence, by this driver or by one resumed on another host (their clocks agree to
well under the second a relaunch waits). A write that reached the server before the fence
was set was the launch's own and stays.

Example:
    >>> launch, fence, again = token(0, 1000, 1), token(0, 2000, 0), token(0, 3000, 2)
    >>> admits(launch, None), admits(launch, fence), admits(again, fence)
    (True, False, True)
    >>> admits(token(3, 1500, 1), fence)  # a later segment of the trial
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from mlflow.tracking.request_header.abstract_request_header_provider import (
    RequestHeaderProvider,
)

HEADER = "X-Elastune-Fence"
TAG = "elastune.fence"

# The token of the segment launch this context writes for (None: no fence).
_token: contextvars.ContextVar[str | None] = contextvars.ContextVar("fence", default=None)


def token(start: float, stamp: int, attempt: int) -> str:
    """A launch's token (``attempt`` 0: a fence), ``stamp`` its time in milliseconds."""
    return f"{start:g}/{stamp}/{attempt}"


def _order(value: str) -> tuple[float, int]:
    start, stamp, _ = value.split("/")
    return float(start), int(stamp)


def admits(write: str, fence: str | None) -> bool:
    """Does a run whose fence is ``fence`` take a write carrying token ``write``?"""
    return fence is None or _order(write) >= _order(fence)


@contextlib.contextmanager
def fenced(value: str | None) -> Iterator[None]:
    """Every MLflow request made in the block (and in threads that copy its context)
    carries ``value``."""
    reset = _token.set(value)
    try:
        yield
    finally:
        _token.reset(reset)


def fenced_call(value: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` :func:`fenced` by ``value`` (in a worker process)."""
    with fenced(value):
        return fn(*args, **kwargs)


def relaunched() -> bool:
    """Is this context writing for a relaunched segment (attempt 2 or later)? Such a
    segment may retrain epochs whose metrics a launch given up on had already logged."""
    value = _token.get()
    return value is not None and int(value.rsplit("/", 1)[1]) > 1


class FenceHeader(RequestHeaderProvider):
    """MLflow's client adds :data:`HEADER` to its requests inside :func:`fenced` (registered
    as an ``mlflow.request_header_provider`` entry point)."""

    def in_context(self) -> bool:
        return _token.get() is not None

    def request_headers(self) -> dict[str, str]:
        return {HEADER: _token.get() or ""}


# --- the server's side ---------------------------------------------------------------------

ARTIFACT_RUN = re.compile(r"/mlflow-artifacts/artifacts/\d+/([0-9a-f]{32})/")
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Fence:
    """ASGI middleware: a write carrying :data:`HEADER` to a run whose :data:`TAG` is newer
    than its token is refused with 409 (``ABORTED``). It can only refuse; whatever it lets
    through still meets the app's own authentication."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        value = headers.get(HEADER.lower().encode())
        if scope["type"] != "http" or value is None or scope["method"] not in ("POST", "PUT"):
            await self.app(scope, receive, send)
            return
        run_id, receive = await _run_of(scope, receive)
        if run_id is not None and not admits(value.decode(), await _fence_of(run_id)):
            body = json.dumps({"error_code": "ABORTED", "message": f"fenced: {value.decode()}"})
            await send({"type": "http.response.start", "status": 409,
                        "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": body.encode()})
            return
        await self.app(scope, receive, send)


async def _run_of(scope: dict[str, Any], receive: Receive) -> tuple[str | None, Receive]:
    """The run a write goes to (an artifact's path, or a JSON body's ``run_id``), and a
    ``receive`` that replays the body read for it."""
    found = ARTIFACT_RUN.search(scope["path"])
    if found is not None:
        return found.group(1), receive
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    with contextlib.suppress(ValueError, AttributeError):
        data = json.loads(body)
        return data.get("run_id") or data.get("run_uuid"), replay
    return None, replay


async def _fence_of(run_id: str) -> str | None:
    import anyio

    try:
        return await anyio.to_thread.run_sync(_read_fence, run_id)
    except Exception:  # no such run: the app answers for it
        return None


def _read_fence(run_id: str) -> str | None:
    """Run ``run_id``'s :data:`TAG`: from a database store, that one row (a whole run, with
    its params, tags and latest metrics, is several queries, and every fenced write asks)."""
    from mlflow.server.handlers import _get_tracking_store
    from mlflow.store.tracking.dbmodels.models import SqlTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = _get_tracking_store()
    if not isinstance(store, SqlAlchemyStore):
        return store.get_run(run_id).data.tags.get(TAG)
    with store.ManagedSessionMaker() as session:
        row = session.get(SqlTag, (TAG, run_id))
        return None if row is None else row.value


def create_app() -> Any:
    """``mlflow server --app-name elastune-fenced``: MLflow's basic-auth app behind the fence."""
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as with_auth

    return Fence(with_auth(flask_app))
