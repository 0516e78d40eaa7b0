"""Tiny skills built as zips inside the tests (tools.skills reads them)."""

from __future__ import annotations

import io
import textwrap
import zipfile
from typing import Any

import yaml

FINDING = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "lines": {"type": "integer"}},
    "required": ["summary"],
}
ARGUMENTS = {
    "type": "object",
    "properties": {"problem_type": {"type": "string"}, "services": {"type": "array"}},
}


def manifest(name: str = "count-errors", version: str = "1.0", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "version": version,
        "description": "Counts the ERROR lines of the bundle's logs",
        "arguments": ARGUMENTS,
        "result": FINDING,
        "entry": "main.py",
        **fields,
    }


def skill_zip(
    script: str,
    *,
    files: dict[str, bytes] | None = None,
    raw_manifest: str | None = None,
    **fields: Any,
) -> bytes:
    """A zip of skill.yaml (`manifest(**fields)`), main.py (`script`) and `files`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        text = raw_manifest if raw_manifest is not None else yaml.safe_dump(manifest(**fields))
        archive.writestr("skill.yaml", text)
        archive.writestr("main.py", textwrap.dedent(script))
        for path, content in (files or {}).items():
            archive.writestr(path, content)
    return buffer.getvalue()


# Reads the bundle's logs.jsonl (read-only, where AERO_BUNDLE says: /bundle in bwrap)
# and counts its ERROR lines.
COUNT_ERRORS = """
    import json, os, sys
    args = json.load(sys.stdin)
    errors = 0
    with open(os.path.join(os.environ["AERO_BUNDLE"], "logs.jsonl")) as logs:
        for line in logs:
            if json.loads(line).get("level") == "ERROR":
                errors += 1
    print(json.dumps({"summary": f"{errors} ERROR lines ({args.get('problem_type', '?')})",
                      "lines": errors}))
"""
