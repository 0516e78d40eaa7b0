"""A simulated OpenAI-compatible server for tests, demos and benchmarks.

Real HTTP on 127.0.0.1 (the stdlib's threading server: one thread per connection, so a
hanging reply never blocks the next request). It serves `GET /v1/models` and
`POST /v1/chat/completions`, plain or streamed (SSE, with a final usage chunk when the
client asks for `stream_options.include_usage`), with tool calls.

Replies come from a script (YAML or JSON), first matching rule wins:

    latency: 0.2                  # seconds before every reply (default 0)
    models: [fake-1]              # what /v1/models lists
    rules:
      - match: {call: 1}          # the first chat completion this server answers
        fault: "429"              # 500, 429 (with retry_after), hang, invalid_body,
        retry_after: 2            # invalid_json, malformed_tool_args, unknown_tool;
      - match: {call: 2}          # or any HTTP error status
        status: 401
      - match: {last_user: "105机位"}   # a substring of the last user message
        json: {flight_no: CA1234}        # the reply content, as JSON text
        times: 1                          # a rule may be used this many times only
      - match: {after_tool: lookup_flight_plan}   # the last message is this tool's result
        tool_calls: [{name: assess_risk, arguments: {}}]
      - content: "done"           # no match: always applies
        usage: {prompt_tokens: 100, completion_tokens: 20}   # or no_usage: true

A request that no rule matches gets HTTP 404 with the reason, so a test never passes on
a reply nobody scripted. Every request is kept (`FakeLLMServer.requests`) for assertions.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Fault = Literal[
    "500",
    "429",
    "hang",
    "invalid_body",
    "invalid_json",
    "malformed_tool_args",
    "unknown_tool",
]


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call: int | list[int] | None = Field(default=None, description="1-based index of the call")
    last_user: str | None = Field(default=None, description="substring of the last user message")
    last_user_regex: str | None = None
    after_tool: str | None = Field(
        default=None, description="the last message is this tool's result"
    )
    has_tools: bool | None = None
    model: str | None = None


class ToolCallSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: Match = Field(default_factory=Match)
    content: str | None = None
    json_: Any = Field(default=None, alias="json")
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    fault: Fault | None = None
    status: int | None = Field(default=None, ge=400, le=599, description="reply with this error")
    retry_after: float | None = None
    latency: float | None = None
    times: int | None = Field(default=None, ge=1)
    usage: Usage = Field(default_factory=Usage)
    no_usage: bool = Field(
        default=False,
        description="report no usage at all (no usage field, no usage chunk even when "
        "the client asks for one), as some OpenAI-compatible servers do",
    )


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latency: float = 0.0
    chunk_size: int = Field(default=8, ge=1, description="characters per streamed content delta")
    chunk_delay: float = 0.0
    hang_seconds: float = 600.0
    models: list[str] = Field(default_factory=lambda: ["fake-1"])
    rules: list[Rule] = Field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> Script:
        """A script file, YAML or JSON (JSON is YAML). Raises ValueError with the problem."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not YAML/JSON: {exc}") from exc
        return cls.parse(data, source=str(path))

    @classmethod
    def parse(cls, data: Any, source: str = "script") -> Script:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"{source}: {exc}") from exc


def _last(messages: list[dict[str, Any]], role: str) -> dict[str, Any] | None:
    for message in reversed(messages):
        if message.get("role") == role:
            return message
    return None


def _text(message: dict[str, Any] | None) -> str:
    if not message:
        return ""
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


class FakeLLMServer:
    """The server and its script; start() runs it in a daemon thread."""

    def __init__(self, script: Script | None = None, host: str = "127.0.0.1", port: int = 0):
        self.script = script or Script.parse({})
        self.requests: list[dict[str, Any]] = []
        self.calls = 0
        self._used: dict[int, int] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = _Server((host, port), _handler_for(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def set_script(self, script: Script | dict[str, Any]) -> None:
        with self._lock:
            self.script = script if isinstance(script, Script) else Script.parse(script)
            self._used.clear()
            self.calls = 0
            self.requests.clear()

    def start(self) -> FakeLLMServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="fake-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # releases hanging replies
        self.httpd.shutdown()
        self.httpd.server_close()

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def choose(self, body: dict[str, Any]) -> tuple[int, Rule | None, str]:
        """Count the call and pick its rule (consuming one use of a limited rule)."""
        messages = body.get("messages") or []
        last_user = _text(_last(messages, "user"))
        last = messages[-1] if messages else {}
        with self._lock:
            self.calls += 1
            call = self.calls
            for index, rule in enumerate(self.script.rules):
                if rule.times is not None and self._used.get(index, 0) >= rule.times:
                    continue
                if not _matches(rule.match, call, body, last_user, last, messages):
                    continue
                self._used[index] = self._used.get(index, 0) + 1
                return call, rule, ""
        return call, None, f"no rule matches call {call} (last user message {last_user!r})"


def _matches(
    match: Match,
    call: int,
    body: dict[str, Any],
    last_user: str,
    last: dict[str, Any],
    messages: list[dict[str, Any]],
) -> bool:
    if match.call is not None:
        wanted = match.call if isinstance(match.call, list) else [match.call]
        if call not in wanted:
            return False
    if match.last_user is not None and match.last_user.lower() not in last_user.lower():
        return False
    if match.last_user_regex is not None and not re.search(match.last_user_regex, last_user):
        return False
    if match.has_tools is not None and bool(body.get("tools")) != match.has_tools:
        return False
    if match.model is not None and body.get("model") != match.model:
        return False
    if match.after_tool is not None:
        if last.get("role") != "tool":
            return False
        names = {
            tc.get("id"): (tc.get("function") or {}).get("name")
            for m in messages
            if m.get("role") == "assistant"
            for tc in m.get("tool_calls") or []
        }
        if names.get(last.get("tool_call_id")) != match.after_tool:
            return False
    return True


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _reply(server: FakeLLMServer, rule: Rule, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message and usage for a rule (faults in the message included)."""
    content: str | None = rule.content
    if rule.json_ is not None:
        content = json.dumps(rule.json_, ensure_ascii=False)
    tool_calls: list[dict[str, Any]] = [
        {
            "id": spec.id or f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {
                "name": spec.name,
                "arguments": spec.arguments
                if isinstance(spec.arguments, str)
                else json.dumps(spec.arguments, ensure_ascii=False),
            },
        }
        for spec in rule.tool_calls
    ]
    if rule.fault == "invalid_json":
        # A reply cut off half way: what a model that ran out of tokens sends.
        text = content or '{"answer": "yes"}'
        content = text[: max(1, len(text) // 2)]
    elif rule.fault == "malformed_tool_args":
        tool_calls = tool_calls or [_tool_call("assess_risk", "")]
        for call in tool_calls:
            call["function"]["arguments"] = '{"value": "unterminated'
    elif rule.fault == "unknown_tool":
        tool_calls = [_tool_call("launch_fireworks", "{}")]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    prompt = json.dumps(body.get("messages") or [], ensure_ascii=False)
    completion = (content or "") + "".join(c["function"]["arguments"] for c in tool_calls)
    usage = {
        "prompt_tokens": rule.usage.prompt_tokens
        if rule.usage.prompt_tokens is not None
        else _estimate_tokens(prompt),
        "completion_tokens": rule.usage.completion_tokens
        if rule.usage.completion_tokens is not None
        else _estimate_tokens(completion),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {"message": message, "usage": None if rule.no_usage else usage}


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class _Server(ThreadingHTTPServer):
    # The stdlib listens with a backlog of 5: 200 clients connecting at once (the LLM
    # runner's calls in bench/llm_bound.py) were refused until their retries.
    request_queue_size = 1024
    daemon_threads = True


def _handler_for(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: tests read `server.requests`

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
            kind = {429: "rate_limit_exceeded", 404: "not_found"}.get(status, "server_error")
            self._json(status, {"error": {"message": message, "type": kind}}, headers)

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._error(404, f"no route {self.path}")
                return
            models = [
                {"id": name, "object": "model", "created": 0, "owned_by": "aero-fake"}
                for name in server.script.models
            ]
            self._json(200, {"object": "list", "data": models})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}")
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._error(400, "the request body is not JSON")
                return
            call, rule, reason = server.choose(body)
            server.requests.append(
                {
                    "call": call,
                    "path": self.path,
                    "body": body,
                    "auth": self.headers.get("Authorization"),
                    "fault": rule.fault if rule else None,
                }
            )
            if rule is None:
                self._error(404, reason)
                return
            latency = rule.latency if rule.latency is not None else server.script.latency
            if latency and server.stopping.wait(latency):
                return
            if rule.fault == "500" or rule.status:
                status = rule.status or 500
                headers = (
                    {} if rule.retry_after is None else {"Retry-After": f"{rule.retry_after:g}"}
                )
                self._error(status, f"simulated HTTP {status}", headers)
                return
            if rule.fault == "429":
                wait = rule.retry_after if rule.retry_after is not None else 1
                self._error(429, "simulated rate limit", {"Retry-After": f"{wait:g}"})
                return
            if rule.fault == "hang":
                server.stopping.wait(server.script.hang_seconds)
                self.close_connection = True
                return
            if rule.fault == "invalid_body":
                data = b'{"id": "chatcmpl-broken", "choices": [{'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            reply = _reply(server, rule, body)
            model = body.get("model") or server.script.models[0]
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(model, reply, include_usage)
                return
            self._json(
                200,
                {
                    "id": f"chatcmpl-{call}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": reply["message"],
                            "finish_reason": "tool_calls"
                            if reply["message"].get("tool_calls")
                            else "stop",
                        }
                    ],
                    **({"usage": reply["usage"]} if reply["usage"] is not None else {}),
                },
            )

        def _stream(self, model: str, reply: dict[str, Any], include_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            # Chunked, so the connection stays open for the client's next call, as a real
            # provider's does: closing it after every stream made the LLM runner open a
            # TCP connection per call. Closed only when a stream breaks off.
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk_id = f"chatcmpl-{uuid.uuid4().hex[:8]}"

            def send(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bool:
                payload: dict[str, Any] = {
                    "id": chunk_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": choices,
                }
                if usage is not None:
                    payload["usage"] = usage
                line = "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"
                if not self._chunk(line.encode()):
                    return False  # the client went away
                delay = server.script.chunk_delay
                if delay and server.stopping.wait(delay):
                    self.close_connection = True  # cut off: the client sees it end
                    return False
                return True

            message = reply["message"]
            if not send([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]):
                return
            content = message.get("content") or ""
            size = server.script.chunk_size
            for start in range(0, len(content), size):
                delta = {"content": content[start : start + size]}
                if not send([{"index": 0, "delta": delta, "finish_reason": None}]):
                    return
            for index, call in enumerate(message.get("tool_calls") or []):
                head = {
                    "index": index,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""},
                }
                if not send([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]):
                    return
                arguments = call["function"]["arguments"]
                for start in range(0, len(arguments), size):
                    piece = {
                        "index": index,
                        "function": {"arguments": arguments[start : start + size]},
                    }
                    if not send(
                        [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]
                    ):
                        return
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            if not send([{"index": 0, "delta": {}, "finish_reason": finish}]):
                return
            if include_usage and reply["usage"] is not None:
                send([], reply["usage"])
            if self._chunk(b"data: [DONE]\n\n"):
                self._chunk(b"")  # the last chunk: the reply is complete

        def _chunk(self, data: bytes) -> bool:
            """One chunk of a chunked body (empty: the end). False, and the connection
            closed, when the client went away."""
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                self.close_connection = True
                return False
            return True

    return Handler
