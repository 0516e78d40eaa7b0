from __future__ import annotations

from django.urls import path

from approvals.consumers import ApprovalQueueConsumer, TodoListConsumer

websocket_urlpatterns = [
    path("ws/approvals/", ApprovalQueueConsumer.as_asgi()),
    path("ws/todos/", TodoListConsumer.as_asgi()),
]
