"""`Idempotency-Key` for POSTs that create things: the same key and request returns the
first response again, the same key with another request is refused (422), and keys are
forgotten after settings.AERO_IDEMPOTENCY_HOURS."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from api.errors import ApiError
from api.models import IdempotencyKey

# The header of a response replayed for a repeated Idempotency-Key.
REPLAYED = "Idempotent-Replayed"
KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII, as in the IETF draft


RETRY_SAFELY = "Retry safely: the same key and body return the first response (24 h)."


def key_header(description: str = RETRY_SAFELY) -> Any:
    """The optional `Idempotency-Key` header of an operation that creates or acts: printable
    ASCII, at most 255 characters."""
    from ninja import Header

    return Header(
        None,
        alias="Idempotency-Key",
        max_length=255,
        pattern=r"^[\x21-\x7e]{1,255}$",
        description=description,
    )


def request_hash(method: str, path: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([method, path, body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def purge_expired() -> int:
    cutoff = timezone.now() - timedelta(hours=settings.AERO_IDEMPOTENCY_HOURS)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def run_once(
    user: Any,
    key: str | None,
    fingerprint: str,
    run: Callable[[], tuple[int, dict[str, Any]]],
) -> tuple[int, dict[str, Any], bool]:
    """Run `run` (status, JSON body) at most once per (user, key). Returns the status, the
    body and whether it was replayed. The key row is inserted first, inside the same
    transaction as the work: a concurrent request with the same key waits on the unique
    index until this one commits, then replays its response. A refused request (an
    ApiError from `run`) rolls the key back, so a corrected retry may reuse it."""
    if key is None:
        status, body = run()
        return status, body, False
    if not KEY_PATTERN.match(key):
        raise ApiError(
            422,
            "invalid_idempotency_key",
            "Idempotency-Key must be 1-255 visible ASCII characters.",
        )
    purge_expired()
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(
                    user=user, key=key, request_hash=fingerprint, status_code=0
                )
        except IntegrityError:
            row = IdempotencyKey.objects.select_for_update().get(user=user, key=key)
            if row.request_hash != fingerprint:
                raise ApiError(
                    422,
                    "idempotency_key_reused",
                    "This Idempotency-Key was already used with a different request.",
                ) from None
            return row.status_code, row.response, True
        status, body = run()
        row.status_code, row.response = status, body
        row.save(update_fields=["status_code", "response"])
    return status, body, False


def answer_once(
    request: HttpRequest,
    response: HttpResponse,
    key: str | None,
    sent: dict[str, Any],
    run: Callable[[], tuple[int, dict[str, Any]]],
) -> tuple[int, dict[str, Any]]:
    """`run_once` for the POST `request`, fingerprinted by its path and `sent` (what was
    sent, as the work reads it): its status and body, a replay marked as one."""
    status, body, replayed = run_once(
        request.user, key, request_hash("POST", request.path, sent), run
    )
    if replayed:
        mark_replayed(request, response)
    return status, body


def mark_replayed(request: HttpRequest, response: HttpResponse) -> None:
    """A replayed answer says so: its header, and the request log's `replayed`."""
    request.idempotent_replay = True  # type: ignore[attr-defined]
    response[REPLAYED] = "true"
