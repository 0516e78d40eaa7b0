"""The pack's event types, by name (declared in sessions.EVENT_TYPES)."""

from __future__ import annotations

# What a diagnosis was asked with (its bundle, the reporter's choices), written with the
# session's creation.
REQUESTED = "diagnosis.requested"
# The knowledge items found like the conclusion, with score and strategy.
SIMILAR = "diagnosis.similar_cases"
# A completed session saved into the knowledge base.
SAVED = "diagnosis.knowledge_saved"
