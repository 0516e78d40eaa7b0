from __future__ import annotations

import uuid

from django.db import transaction

from aero import stamps
from diagnosis.push import group_send

QUEUE_GROUP = "approvals-queue"


def notify_queue() -> None:
    """Tell every open queue page to re-read the queue, after commit."""
    # The stamp names this change: the queue pages every viewer shows are rendered once
    # per stamp (and role set), not once per viewer.
    transaction.on_commit(_queue_changed)


def _queue_changed() -> None:
    # The pages' stamp first: a viewer the notice wakes reads the new one.
    stamps.touch_now(stamps.QUEUE)
    group_send(QUEUE_GROUP, {"type": "queue.notice", "stamp": uuid.uuid4().hex})
