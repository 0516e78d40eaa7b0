"""What the web server serves beyond HTTP, contributed by the apps from their
AppConfig.ready(), so the kernel names no app: their websocket routes, and what a web
process starts with (warm-up, the embedded worker, the sweeper).

Page sockets use the login cookie, so they check the Origin (scheme, host and port:
aero.ws_origin); an app under its own path
prefix (the API stream) authenticates with a token (no ambient credential) and serves
clients that send no Origin at all.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, Literal

from channels.auth import AuthMiddleware
from channels.routing import URLRouter
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from aero.db_async import Batched
from aero.sessions import users_signed_in
from aero.ws_origin import PageOriginValidator

Server = Literal["asgi", "wsgi"]

# Each returns its routes or app when the server builds its router, so registering
# imports no consumer (AppConfig.ready runs in every process, commands included).
_page_routes: list[Callable[[], list[Any]]] = []
_prefixed: list[tuple[str, Callable[[], Any]]] = []
_start_hooks: list[Callable[[Server], None]] = []


def add_page_sockets(routes: Callable[[], list[Any]]) -> None:
    if routes not in _page_routes:
        _page_routes.append(routes)


def add_socket_app(prefix: str, app: Callable[[], Any]) -> None:
    """Sockets whose path starts with `prefix` go to `app()`, outside the page stack."""
    if all(known != prefix for known, _ in _prefixed):
        _prefixed.append((prefix, app))


def on_start(hook: Callable[[Server], None]) -> None:
    """`hook(server)` runs once the web process has loaded Django, before it serves."""
    if hook not in _start_hooks:
        _start_hooks.append(hook)


# The sign-ins of the sockets opening at once, looked up together (aero.db_async.Batched).
_signed_in_user = Batched(users_signed_in, None)


class _AuthMiddleware(AuthMiddleware):
    """channels' AuthMiddleware, its sign-in lookup batched on the bounded database pool:
    channels runs one get_user per socket on the one thread-sensitive thread, and a
    thousand sockets opening at once (a page's viewers after a restart) each waited
    for every lookup before theirs, past daphne's handshake timeout."""

    async def resolve_scope(self, scope: Any) -> None:
        key = scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME)
        user = await _signed_in_user(key) if key else None
        scope["user"]._wrapped = user if user is not None else AnonymousUser()


def page_routes() -> list[Any]:
    """Every app's and pack's page socket routes."""
    return [route for routes in _page_routes for route in routes()]


def page_websocket() -> Any:
    routes = page_routes()
    stack = CookieMiddleware(SessionMiddleware(_AuthMiddleware(URLRouter(routes))))
    return PageOriginValidator(stack)


def websocket(pages: Any) -> Callable[..., Any]:
    """The websocket application: an app's own prefix first, the page sockets else."""
    prefixed = [(prefix, app()) for prefix, app in _prefixed]

    async def route(scope: Any, receive: Any, send: Any) -> None:
        app = next((app for prefix, app in prefixed if scope["path"].startswith(prefix)), pages)
        await app(scope, receive, send)

    return route


def started(server: Server) -> None:
    for hook in _start_hooks:
        hook(server)


def freeze_start_up(young: int | None = None) -> None:
    """The server process's last start-up step: every view imported (the URLconf, else
    the first request's), then what start-up made moved out of the cyclic collector's
    reach (gc.freeze). Its full collections walked all of it, ~180,000 objects in a
    gunicorn worker, ~100 ms of CPU with the GIL held: every thread of the process
    stalled, 90-590 ms at 50 clients (issue 37 item 2's p99). What requests make is
    collected as before; only cycles among the start-up's objects are never freed.

    `young`: the youngest generation's threshold (allocations between its collections,
    700 by default), for a process holding many sockets."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  # imports every view module
    gc.collect()
    gc.freeze()
    if young is not None:
        gc.set_threshold(young, *gc.get_threshold()[1:])
