"""Health checks of idle PostgreSQL connections without a round trip.

A worker checks its connections before each job (Django's CONN_HEALTH_CHECKS makes the
next query run `SELECT 1` first; the checkpointer's connection ran its own): three round
trips per job, 2,400 in the model-bound bench, to learn what the kernel already knows.
An idle connection's socket has nothing to read unless the server sent something: a
backend that ends (PostgreSQL restarted, the backend terminated) sends its FATAL message
and closes, which makes the socket readable (or hung up). So: a quiet socket is as alive
as a `SELECT 1` could tell (either can be wrong a moment later: the server may die right
after); a socket with anything on it gets the real check, which reads what arrived.
"""

from __future__ import annotations

import select
from typing import Any

from django.db import connections

_EVENTS = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


def socket_quiet(fileno: int) -> bool:
    """Whether nothing arrived on the socket (no data, no hang-up, no error): one poll(2)
    with no timeout."""
    poller = select.poll()
    poller.register(fileno, _EVENTS)
    return not poller.poll(0)


def psycopg_quiet(conn: Any) -> bool:
    """Whether a psycopg connection is open and its socket quiet. Unknown (closed,
    broken, no socket) reads as not quiet: the caller's real check decides."""
    try:
        if conn.closed or conn.broken:
            return False
        return socket_quiet(conn.fileno())
    except Exception:
        return False


def check_django_connections() -> None:
    """After close_old_connections() (which asks the next query of each connection to
    run a health check): mark the check done for every PostgreSQL connection whose
    socket is quiet, so its next query runs at once. A connection with anything on its
    socket keeps Django's own check (`SELECT 1`, close and reconnect if it fails)."""
    for wrapper in connections.all(initialized_only=True):
        conn: Any = wrapper  # django-stubs does not declare health_check_enabled/_done
        if (
            conn.vendor == "postgresql"
            and conn.connection is not None
            and conn.health_check_enabled
            and not conn.health_check_done
            and psycopg_quiet(conn.connection)
        ):
            conn.health_check_done = True
