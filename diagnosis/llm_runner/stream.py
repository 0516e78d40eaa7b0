"""One model call, streamed: the chat completion LangChain would send, read as plain
server-sent events, its text handed to the caller's buffer as it arrives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx2
from langchain_core.messages import AIMessage, InvalidToolCall, ToolCall
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call

if TYPE_CHECKING:
    import openai


async def drain_rest(response: Any) -> None:
    """Read what is left of a response's body (the chunked end after [DONE]), for at most
    0.1 s, then close it: read whole, HTTP/1.1 keeps the connection for the next call."""
    try:
        async with asyncio.timeout(0.1):
            # The transport's own byte stream: the response's iterators refuse a body
            # already partly read (the lines up to [DONE]).
            async for _ in response.stream:
                pass
    except Exception:  # whichever HTTP package the SDK runs on: cleanup never fails
        pass  # cleanup only: the reply is complete; the connection is simply not kept
    finally:
        await response.aclose()


# The SDK's own drain (what its stream does at [DONE]), looked up at the first call, not
# at import (every web process imports this module at start; most never call a model).
drain_response_async: Callable[[Any], Awaitable[None]] | None = None


def _drain() -> Callable[[Any], Awaitable[None]]:
    global drain_response_async
    if drain_response_async is None:
        try:
            # Private, so an upgrade may move it: then our own, which does the same.
            from openai._streaming_cleanup import drain_response_async as sdk_drain
        except ImportError:  # pragma: no cover - depends on the installed SDK
            sdk_drain = drain_rest
        drain_response_async = sdk_drain
    return drain_response_async


async def stream_reply(
    client: Any,
    messages: list[Any],
    options: dict[str, Any],
    buffer: list[str],
    sdk: openai.AsyncOpenAI | None = None,
) -> AIMessage:
    """One streamed chat completion, read as plain server-sent events: the text
    goes to `buffer` as it arrives; the reply is one AIMessage, its tool arguments parsed
    strictly (strict_calls). The request is LangChain's (`_get_request_payload`: the
    same messages, tools and options as `astream`) sent by the same SDK client (its pool,
    timeout and HTTP errors); only the reading is ours: `astream` built an SDK pydantic
    object, a LangChain chunk and a merged message per chunk, about half of the runner's
    CPU with 200 calls in flight. `sdk`: the client's SDK client with the caller's own
    connection pool (`Runner._sdk_client`); LangChain's by default."""
    import openai

    payload = client._get_request_payload(
        messages, stream=True, stream_options={"include_usage": True}, **options
    )
    content: list[str] = []
    tools: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    meta: dict[str, Any] = {}
    sdk = sdk or client.root_async_client
    create = sdk.chat.completions.with_streaming_response.create
    # The body goes as `extra_body`, which the SDK sends as it is: passed as `create`'s
    # own arguments, the SDK walked every message and tool schema against its TypedDicts
    # first (`async_maybe_transform`, a large share of the runner's CPU per call);
    # LangChain built the payload from the same types already.
    body = {k: v for k, v in payload.items() if k not in ("model", "stream")}
    async with create(
        model=payload["model"], messages=[], stream=True, extra_body=body
    ) as response:
        try:
            async for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments, `event:` lines
                data = line[5:].strip()
                if data == "[DONE]":
                    # What the SDK's own stream does at [DONE]: read the rest of the body
                    # (the chunked end, at most 0.1 s) so that HTTP/1.1 keeps the
                    # connection for the next call. Closed unread, every call opened a
                    # TCP connection of its own (about a tenth of the runner's CPU).
                    if response.http_response.http_version == "HTTP/1.1":
                        await _drain()(response.http_response)
                    break
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise ValueError("an event that is not a JSON object")
                if chunk.get("error"):
                    error = chunk["error"]
                    text = error.get("message") if isinstance(error, dict) else str(error)
                    raise openai.APIError(
                        str(text), response.http_request, body=error
                    )  # what the SDK raises for an error inside the stream
                meta.setdefault("id", chunk.get("id"))
                meta.setdefault("model_name", chunk.get("model"))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if choice.get("finish_reason"):
                        meta["finish_reason"] = choice["finish_reason"]
                    piece = delta.get("content")
                    if isinstance(piece, str) and piece:
                        content.append(piece)
                        buffer.append(piece)
                    for part in delta.get("tool_calls") or ():
                        entry = tools.setdefault(
                            int(part.get("index") or 0), {"id": None, "name": "", "args": []}
                        )
                        function = part.get("function") or {}
                        entry["id"] = part.get("id") or entry["id"]
                        entry["name"] += function.get("name") or ""
                        entry["args"].append(function.get("arguments") or "")
        # The body is read after the SDK's own error handling (which covers the request
        # and the headers): a transport error mid-body is turned into the SDK's error, as
        # the SDK would turn it before the headers, so that it is retried as one. The
        # SDK's transport is httpx2 (not httpx: its exceptions are other classes).
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(response.http_request) from exc
        except httpx2.TransportError as exc:
            raise openai.APIConnectionError(request=response.http_request) from exc
    if not meta:
        raise ValueError("the model sent an empty stream")
    usage_metadata: UsageMetadata | None = None
    if usage is not None:
        prompt, completion = (
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )
        usage_metadata = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        }
    calls, invalid = strict_calls(
        [(t["name"], "".join(t["args"]), t["id"]) for _, t in sorted(tools.items())]
    )
    return AIMessage(
        content="".join(content),
        tool_calls=calls,
        invalid_tool_calls=invalid,
        usage_metadata=usage_metadata,
        response_metadata={
            "finish_reason": meta.get("finish_reason"),
            "model_name": meta.get("model_name"),
            "model_provider": "openai",
        },
        id=meta.get("id"),
    )


def strict_calls(
    raw_calls: list[tuple[str | None, str, str | None]],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Streamed tool calls (name, raw arguments, id), their arguments parsed strictly:
    arguments that are not a JSON object make an invalid call (the repair turn)."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for name, raw, call_id in raw_calls:
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            args, problem = None, f"not valid JSON: {exc.msg}"
        else:
            problem = "" if isinstance(args, dict) else "not a JSON object"
        if problem or not isinstance(args, dict):
            invalid.append(invalid_tool_call(name=name, args=raw, id=call_id, error=problem))
        else:
            calls.append(tool_call(name=name or "", args=args, id=call_id))
    return calls, invalid
