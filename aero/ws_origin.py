"""Which pages may open a page socket: the socket carries the sign-in cookie, so a page
of another origin must not (cross-site WebSocket hijacking). An origin is its scheme,
host and port together: a page on another port of the same host is another origin
(another application, perhaps anyone's), which Channels' AllowedHostsOriginValidator,
comparing hosts only, let in.

Allowed: the socket's own origin (its Host, an allowed host, with http or https as the
socket is ws or wss, or as the trusted proxy header says), CSRF_TRUSTED_ORIGINS (Django's
forms trust the same pages) and AERO_PAGE_ORIGINS (where pages are served when their
sockets are on another port: scripts/run.sh with Redis).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # scheme, host (lower case), port


def parse_origin(value: str) -> Origin | None:
    """(scheme, host, port) of an http(s) origin, None for anything else ("null", a
    path-only or malformed value)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            try:
                return str(value.decode("latin1"))
            except UnicodeDecodeError:
                return None
    return None


def _secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") == "wss":
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        # "HTTP_X_FORWARDED_PROTO" names the header x-forwarded-proto.
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        sent = _header(scope, name)
        return sent is not None and sent.split(",")[0].strip() == proxy[1]
    return False


def own_origin(scope: dict[str, Any]) -> Origin | None:
    """The origin the socket itself was opened on, when its Host is an allowed host."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return parse_origin(f"{'https' if _secure(scope) else 'http'}://{host}")


def _trusted(origin: Origin, patterns: Iterable[str]) -> bool:
    scheme, host, port = origin
    for pattern in patterns:
        # Django's form for CSRF_TRUSTED_ORIGINS: "https://*.example.com" is every
        # subdomain of example.com (on the same scheme and port).
        wildcard = "://*." in pattern
        allowed = parse_origin(pattern.replace("://*.", "://", 1) if wildcard else pattern)
        if allowed is None or allowed[0] != scheme or allowed[2] != port:
            continue
        if host == allowed[1] or (wildcard and is_same_domain(host, f".{allowed[1]}")):
            return True
    return False


def origin_allowed(scope: dict[str, Any]) -> bool:
    sent = _header(scope, b"origin")
    origin = parse_origin(sent) if sent else None
    if origin is None:
        return False  # browsers always send one: a socket without is not a page's
    if origin == own_origin(scope):
        return True
    return _trusted(origin, [*settings.CSRF_TRUSTED_ORIGINS, *settings.AERO_PAGE_ORIGINS])


class PageOriginValidator:
    """In front of the page sockets: refuses the handshake (403) unless origin_allowed."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
