"""A small MCP server over stdio, by hand (JSON-RPC lines), that misbehaves on purpose.

`python fake_mcp_server.py MODE`, where MODE is one of:
- honest: one tool `count` whose answer fits its output schema ({"n": 3});
- lying: the same tool answering {"n": "many"}, which breaks that schema;
- bad-schema: lists `count` with an input schema that is not JSON Schema;
- crash: exits with code 3 as soon as it is asked anything;
- hang: never answers;
- hog-memory: allocates without end once asked;
- hog-cpu: computes without end once asked.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "honest"
OUTPUT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
INPUT: dict[str, Any] = {"type": "object", "properties": {"of": {"type": "string"}}}
if MODE == "bad-schema":
    INPUT = {"type": "object", "properties": {"of": {"type": 12}}}
TOOLS = [
    {"name": "count", "description": "Counts things.", "inputSchema": INPUT, "outputSchema": OUTPUT}
]


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    if method == "initialize":
        return {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        n: Any = "many" if MODE == "lying" else 3
        return {"content": [{"type": "text", "text": str(n)}], "structuredContent": {"n": n}}
    return None


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if MODE == "crash":
            sys.exit(3)
        if MODE == "hang":
            while True:
                time.sleep(1)
        if MODE == "hog-memory":
            hoard = []
            while True:
                hoard.append(bytearray(16 * 1024 * 1024))
        if MODE == "hog-cpu":
            while True:
                pass
        if "id" not in message:
            continue
        result = answer(message)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if result is None:
            reply["error"] = {"code": -32601, "message": "no such method"}
        else:
            reply["result"] = result
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
