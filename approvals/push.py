from __future__ import annotations

import uuid

from django.db import transaction

from diagnosis.push import group_send

QUEUE_GROUP = "approvals-queue"


def notify_queue() -> None:
    """Tell every open queue page to re-read the queue, after commit."""
    # The stamp names this change: the queue pages every viewer shows are rendered once
    # per stamp (and role set), not once per viewer.
    transaction.on_commit(
        lambda: group_send(QUEUE_GROUP, {"type": "queue.notice", "stamp": uuid.uuid4().hex})
    )
