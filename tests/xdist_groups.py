"""`--dist loadgroup` keeps the tests of one `xdist_group` on one worker by the group name
the worker appends to each test's node id ("...::test_x@faults"); the controller's
scheduler reads it back from there. pytest-xdist 3.8 writes the legacy `_nodeid`
attribute, which pytest 9.2 no longer reads (node ids are structured), so no name was
appended and every group's tests were spread over both workers as if unmarked
(pytest-dev/pytest-xdist#1386). This appends it where xdist did not."""

from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The name loadgroup gives the item's group (xdist's own rule: a test in several
    groups gets their sorted names joined by '_'), or None."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) if names else None


def name_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under loadgroup: give every grouped item the suffix xdist meant
    to give it, and fail the run if that could not be done (an unmarked group silently
    runs on several workers at once)."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue  # ungrouped, or an xdist that names groups itself again
        from _pytest.nodeid import NodeId

        # pytest 9.2's structured id: the suffix goes after the params, as xdist's did.
        item._id = NodeId.parse(f"{item.nodeid}@{group}")
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(
                f"{item.nodeid}: cannot name its xdist_group {group!r} on this pytest; "
                "--dist loadgroup would spread the group over several workers"
            )
