from __future__ import annotations

from django.db import transaction

from diagnosis.push import group_send

QUEUE_GROUP = "approvals-queue"


def notify_queue() -> None:
    """Tell every open queue page to re-read the queue, after commit."""
    transaction.on_commit(lambda: group_send(QUEUE_GROUP, {"type": "queue.notice"}))
