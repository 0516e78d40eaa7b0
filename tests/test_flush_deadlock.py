"""The flush after a transactional test survives being a deadlock's victim: a test
server's transaction that holds one table and then wants another the flush has locked
must not leave the flush failed and the tables full for the next test."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.core.management.color import no_style
from django.db import connection

from tests.conftest import test_db_url as database_url

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_flush_caught_in_a_deadlock_is_tried_again_and_empties_every_table() -> None:
    from django.contrib.auth.models import User

    User.objects.create_user("left-behind")
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    first, last = (connection.ops.quote_name(name) for name in (tables[0], tables[-1]))
    # The other side waits far longer before it checks for a deadlock, so PostgreSQL
    # picks the flush as the victim, as it did in CI.
    other = psycopg.connect(database_url())
    other.execute("SET deadlock_timeout = '20s'")
    other.execute(f"SELECT 1 FROM {last} LIMIT 1")  # holds `last` in an open transaction
    outcome: list[str] = []

    def take_the_first_table_too() -> None:
        time.sleep(0.5)  # the flush has locked `first` and waits for `last`
        other.execute(f"SELECT 1 FROM {first} LIMIT 1")
        other.commit()
        outcome.append("committed")

    side = threading.Thread(target=take_the_first_table_too)
    side.start()
    try:
        connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables))
    finally:
        side.join(timeout=30)
        other.close()
    assert outcome == ["committed"], "the other transaction went on once the flush gave way"
    assert not User.objects.exists(), "the flush's second attempt emptied the tables"
