"""A job's two reads of its checkpoint (the state it waits in, then the run) reach the
database once: the first read is handed to the second, once, within the job
(its fence), and any write to the thread in between drops it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from diagnosis.events import fenced, unfenced
from diagnosis.jobs import agent_graph

pytestmark = pytest.mark.services


@pytest.fixture
def thread(db: None) -> Iterator[dict[str, Any]]:
    saver = agent_graph().checkpointer
    thread_id = str(uuid.uuid4())
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    try:
        yield config
    finally:
        saver.delete_thread(thread_id)  # the saver's connection commits on its own


def save(config: dict[str, Any]) -> str:
    checkpoint = empty_checkpoint()
    agent_graph().checkpointer.put(config, checkpoint, {"source": "input", "step": -1}, {})
    return str(checkpoint["id"])


def test_the_second_read_of_a_job_is_the_first_once(thread: dict[str, Any]) -> None:
    saver = agent_graph().checkpointer
    saved = save(thread)
    with fenced(thread["configurable"]["thread_id"], uuid.uuid4()):
        first = saver.get_tuple(thread)
        assert first is not None and first.checkpoint["id"] == saved
        assert saver.get_tuple(thread) is first  # handed over, not read again
        third = saver.get_tuple(thread)
        assert third is not first and third is not None  # once: then read again
        assert third.checkpoint["id"] == saved


def test_a_write_between_the_reads_is_seen(thread: dict[str, Any]) -> None:
    saver = agent_graph().checkpointer
    save(thread)
    with fenced(thread["configurable"]["thread_id"], uuid.uuid4()):
        saver.get_tuple(thread)
        with unfenced():  # a write the fence does not check drops the kept read too
            newer = save(thread)
        found = saver.get_tuple(thread)
    assert found is not None and found.checkpoint["id"] == newer


def test_another_job_never_gets_a_read_kept_for_an_earlier_one(thread: dict[str, Any]) -> None:
    saver = agent_graph().checkpointer
    save(thread)
    session_id = thread["configurable"]["thread_id"]
    with fenced(session_id, uuid.uuid4()):
        earlier = saver.get_tuple(thread)  # the job ends before its second read
    with fenced(session_id, uuid.uuid4()):
        assert saver.get_tuple(thread) is not earlier
    # Outside any job every read reaches the database.
    assert saver.get_tuple(thread) is not saver.get_tuple(thread)


def test_a_read_no_second_read_asked_for_goes_with_its_job(thread: dict[str, Any]) -> None:
    """A job that found nothing to do reads once and ends: its read must not stay in a
    worker that runs for weeks (one per such job would be a leak)."""
    saver = agent_graph().checkpointer
    save(thread)
    with fenced(thread["configurable"]["thread_id"], uuid.uuid4()):
        saver.get_tuple(thread)
        assert len(saver.kept) == 1
    assert len(saver.kept) == 0
