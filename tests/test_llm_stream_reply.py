"""The LLM runner reads the streamed reply itself: what it stores for the node
must be what LangChain reads from the same reply unstreamed (the blocking mode's path),
or a session would reason differently with the runner than without it. Through the
simulated server over HTTP, chunked small so that every text and argument is split."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx2
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from diagnosis.agent import waits
from diagnosis.agent.clients import classify, client_for
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent.react_tools import tool_schemas
from diagnosis.llm_runner import Runner
from diagnosis.llm_runner.stream import stream_reply
from tests.builtin_data import oil_spill
from tests.llm_helpers import fake_llm, fake_provider

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.django_db

LOOKUPS = [
    {"name": "lookup_aircraft_info", "arguments": {"flight_no": "CA1234"}},
    {"name": "lookup_stand_location", "arguments": {"position": "105机位"}},
]
REPLIES: dict[str, dict[str, Any]] = {
    "text and two tool calls": {"content": "先查航班和机位。Looking up.", "tool_calls": LOOKUPS},
    # Cut arguments: invalid (the repair turn), never completed into a valid call.
    "malformed arguments": {"content": "Assessing.", "fault": "malformed_tool_args"},
    "an unknown tool": {"fault": "unknown_tool"},
    "text only": {"content": "No tool is needed: the stand is already closed."},
    "structured output": {
        "json": {"flight_no": {"value": "CA1234", "quote": "CA1234"}},
        "usage": {"prompt_tokens": 420, "completion_tokens": 96},
    },
}


class _NoAiohttp(httpx2.AsyncClient):
    """What the SDK offers when its aiohttp extra is not installed."""

    def __init__(self, **_: Any) -> None:
        raise RuntimeError("To use the aiohttp client you must have installed the package")


@pytest.fixture(params=["aiohttp", "httpx2"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The runner's pool on the SDK's aiohttp transport, and on LangChain's
    httpx2 pool where the extra is missing: each must keep the same promises."""
    if request.param == "httpx2":
        monkeypatch.setattr(openai, "DefaultAioHttpClient", _NoAiohttp)
    return str(request.param)


def calls(message: AIMessage) -> tuple[list[Any], list[Any]]:
    return (
        [(c["name"], c["args"]) for c in message.tool_calls],
        [(c["name"], c["args"]) for c in message.invalid_tool_calls],
    )


@pytest.mark.parametrize("case", list(REPLIES))
def test_the_runner_reads_a_streamed_reply_as_langchain_reads_it_unstreamed(
    fake_llm: FakeLLMServer, case: str
) -> None:
    fake_llm.set_script({"chunk_size": 3, "rules": [REPLIES[case]]})
    client = client_for(fake_provider(fake_llm))
    messages = [SystemMessage("You are the incident agent."), HumanMessage("105机位燃油泄漏")]
    options: dict[str, Any] = {"tools": tool_schemas(oil_spill())}
    if case == "structured output":
        options = {"response_format": {"type": "json_object"}}
    buffer: list[str] = []

    streamed = asyncio.run(stream_reply(client, messages, options, buffer))
    with waits.no_waits():
        unstreamed = client.invoke(messages, **options)

    assert fake_llm.requests[0]["body"]["stream"] is True
    assert fake_llm.requests[0]["body"]["stream_options"] == {"include_usage": True}
    assert not fake_llm.requests[1]["body"].get("stream")
    # The same request: the conversation and the tools as LangChain sends them.
    for key in ("messages", "tools", "response_format", "model", "temperature"):
        assert fake_llm.requests[0]["body"].get(key) == fake_llm.requests[1]["body"].get(key)
    assert streamed.content == unstreamed.content
    assert "".join(buffer) == streamed.content  # the text streamed as it came, all of it
    assert calls(streamed) == calls(unstreamed)
    if case == "malformed arguments":
        assert streamed.invalid_tool_calls and not streamed.tool_calls
    assert streamed.usage_metadata is not None and unstreamed.usage_metadata is not None
    counted = ("input_tokens", "output_tokens", "total_tokens")
    assert [streamed.usage_metadata.get(k) for k in counted] == [
        unstreamed.usage_metadata.get(k) for k in counted
    ]
    assert (
        streamed.response_metadata["finish_reason"]
        == (unstreamed.response_metadata["finish_reason"])
    )


def count_connections(server: FakeLLMServer) -> list[int]:
    """The TCP connections the server accepts, counted."""
    accepted = [0]
    process = server.httpd.process_request

    def counting(request: Any, address: Any) -> None:
        accepted[0] += 1
        process(request, address)

    server.httpd.process_request = counting  # type: ignore[method-assign,assignment]
    return accepted


def test_calls_in_turn_keep_one_connection_and_a_loop_never_gets_another_loops(
    fake_llm: FakeLLMServer, transport: str
) -> None:
    """The runner reads the body to its end after [DONE] (as the SDK's stream
    does), so HTTP/1.1 keeps the connection for the next call: closed unread, every call
    opened one. Each runner's loop has a pool of its own: a connection kept by one
    loop's pool broke in the next loop ("Event loop is closed")."""
    fake_llm.set_script({"rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm))
    accepted = count_connections(fake_llm)
    messages = [HumanMessage("105机位燃油泄漏")]

    async def three_calls() -> list[str]:
        runner = Runner(enqueue=None)
        sdk = runner._sdk_client(client)
        assert runner._sdk_client(client) is sdk  # one per LangChain client and loop
        replies = [await stream_reply(client, messages, {}, [], sdk) for _ in range(3)]
        await runner._close_clients()
        return [str(reply.content) for reply in replies]

    assert asyncio.run(three_calls()) == [REPLIES["text only"]["content"]] * 3
    assert accepted[0] == 1
    # The next loop (run_pending_inline runs one per call) opens its own.
    assert asyncio.run(three_calls()) == [REPLIES["text only"]["content"]] * 3
    assert accepted[0] == 2


def test_without_langchains_private_pool_builder_the_runner_still_gets_a_pool_of_its_own(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`async_client_of_its_own` borrows LangChain's private builder; if an upgrade
    moves it, the runner falls back to the SDK's public default pool, still its own (not
    LangChain's shared one), and its calls still go out."""
    import sys

    from diagnosis.agent.clients import async_client_of_its_own

    monkeypatch.setattr(openai, "DefaultAioHttpClient", _NoAiohttp)
    monkeypatch.setitem(sys.modules, "langchain_openai.chat_models._client_utils", None)
    fake_llm.set_script({"rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm))
    sdk = async_client_of_its_own(client)
    assert sdk._client is not client.root_async_client._client

    async def one_call() -> str:
        reply = await stream_reply(client, [HumanMessage("105机位燃油泄漏")], {}, [], sdk)
        await sdk.close()
        return str(reply.content)

    assert asyncio.run(one_call()) == REPLIES["text only"]["content"]


def test_our_own_drain_keeps_the_connection_as_the_sdks_does(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """The runner drains the body with the SDK's private helper; if an upgrade moves it,
    `drain_rest` takes over: three calls in turn still share one connection."""
    from diagnosis.llm_runner import stream

    monkeypatch.setattr(stream, "drain_response_async", stream.drain_rest)
    fake_llm.set_script({"rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm))
    accepted = count_connections(fake_llm)

    async def three_calls() -> list[str]:
        runner = Runner(enqueue=None)
        sdk = runner._sdk_client(client)
        messages = [HumanMessage("105机位燃油泄漏")]
        replies = [await stream_reply(client, messages, {}, [], sdk) for _ in range(3)]
        await runner._close_clients()
        return [str(reply.content) for reply in replies]

    assert asyncio.run(three_calls()) == [REPLIES["text only"]["content"]] * 3
    assert accepted[0] == 1


def stream_once(client: Any) -> AIMessage:
    async def call() -> AIMessage:
        runner = Runner(enqueue=None)
        try:
            messages = [HumanMessage("105机位燃油泄漏")]
            return await stream_reply(client, messages, {}, [], runner._sdk_client(client))
        finally:
            await runner._close_clients()

    return asyncio.run(call())


def test_a_reply_that_stalls_mid_body_is_a_timeout_and_retried(
    fake_llm: FakeLLMServer, transport: str
) -> None:
    """The headers came, then nothing for longer than the provider's timeout: the SDK's
    timeout error, which the chain retries, not an error it gives up on at once."""
    fake_llm.set_script({"chunk_delay": 3, "rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm, timeout_seconds=0.5))
    with pytest.raises(openai.APITimeoutError) as caught:
        stream_once(client)
    error = classify(caught.value)
    assert error.retryable and str(error) == "timed out"


def test_a_reply_cut_off_mid_body_is_a_connection_error_and_retried(
    fake_llm: FakeLLMServer, transport: str
) -> None:
    """The server went away in the middle of the body (its end never came): the SDK's
    connection error, retried, not an unknown error given up on at once."""
    fake_llm.set_script({"chunk_delay": 3, "rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm))
    threading.Timer(0.5, fake_llm.stopping.set).start()  # mid-body: the server hangs up
    with pytest.raises(openai.APIConnectionError) as caught:
        stream_once(client)
    error = classify(caught.value)
    assert error.retryable and str(error).startswith("connection failed")


def test_the_runners_pool_is_the_sdks_aiohttp_transport_and_httpx2_without_it(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's own pool is aiohttp's (the SDK's transport for many calls in
    flight at once); without the extra, LangChain's httpx2 pool; the calls go out either
    way."""
    from openai._vendor.httpx_aiohttp import AiohttpTransport

    from diagnosis.agent.clients import async_client_of_its_own

    fake_llm.set_script({"rules": [REPLIES["text only"]]})
    client = client_for(fake_provider(fake_llm))

    def one_call(sdk: openai.AsyncOpenAI) -> str:
        async def call() -> str:
            reply = await stream_reply(client, [HumanMessage("105机位燃油泄漏")], {}, [], sdk)
            await sdk.close()
            return str(reply.content)

        return asyncio.run(call())

    sdk = async_client_of_its_own(client)
    assert isinstance(sdk._client._transport, AiohttpTransport)
    assert one_call(sdk) == REPLIES["text only"]["content"]
    monkeypatch.setattr(openai, "DefaultAioHttpClient", _NoAiohttp)
    sdk = async_client_of_its_own(client)
    assert isinstance(sdk._client._transport, httpx2.AsyncHTTPTransport)
    assert one_call(sdk) == REPLIES["text only"]["content"]


def test_the_runners_aiohttp_pool_goes_through_the_environments_proxy(
    fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment that reaches its model through a proxy (HTTPS_PROXY) keeps doing so
    on the aiohttp transport: the pool routes https:// through it, as
    LangChain's httpx2 pool did."""
    from openai._vendor.httpx_aiohttp import AiohttpTransport

    from diagnosis.agent.clients import async_client_of_its_own

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    sdk = async_client_of_its_own(client_for(fake_provider(fake_llm)))
    routes = {
        str(getattr(transport.proxy, "url", "")): transport
        for transport in sdk._client._mounts.values()
        if isinstance(transport, AiohttpTransport) and transport.proxy is not None
    }
    assert list(routes) == ["http://proxy.invalid:3128"]
    asyncio.run(sdk.close())
