"""The simulated OpenAI-compatible server, driven by the real clients (the OpenAI SDK and
LangChain's ChatOpenAI) over HTTP: scripted replies, tool calls, SSE streaming with
usage, latency, every injected fault, and the management command as its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain_openai import ChatOpenAI

from diagnosis.agent.fake_llm import FakeLLMServer, Script
from tests.llm_helpers import fake_llm
from tests.servers import ROOT, free_port

__all__ = ["fake_llm"]  # the fixture


def client(server: FakeLLMServer, timeout: float = 5) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="k", max_retries=0, timeout=timeout)


def ask(server: FakeLLMServer, text: str, **extra: Any) -> Any:
    return client(server).chat.completions.create(
        model="fake-1", messages=[{"role": "user", "content": text}], **extra
    )


def test_models_are_listed(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"models": ["fake-1", "fake-large"]})
    assert [m.id for m in client(fake_llm).models.list().data] == ["fake-1", "fake-large"]


def test_rules_match_the_last_user_message_and_the_call_index(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {"match": {"call": 3}, "content": "third call"},
                {"match": {"last_user": "STAND 105"}, "json": {"position": "105"}},
                {"content": "anything else", "usage": {"prompt_tokens": 7}},
            ]
        }
    )
    first = ask(fake_llm, "fuel leak at stand 105")
    assert json.loads(first.choices[0].message.content) == {"position": "105"}
    second = ask(fake_llm, "hello")
    assert second.choices[0].message.content == "anything else"
    assert second.usage.prompt_tokens == 7 and second.usage.completion_tokens > 0
    assert ask(fake_llm, "stand 105 again").choices[0].message.content == "third call"
    assert [r["call"] for r in fake_llm.requests] == [1, 2, 3]


def test_a_limited_rule_is_used_up(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"rules": [{"content": "once", "times": 1}, {"content": "after"}]})
    assert [ask(fake_llm, "x").choices[0].message.content for _ in range(3)] == [
        "once",
        "after",
        "after",
    ]


def test_an_unscripted_request_is_an_error_not_a_reply(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"rules": [{"match": {"last_user": "fuel"}, "content": "ok"}]})
    with pytest.raises(openai.NotFoundError, match="no rule matches call 1"):
        ask(fake_llm, "hydraulic")


def test_tool_calls_and_a_rule_after_a_tool_result(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {"match": {"after_tool": "lookup_flight_plan"}, "content": "plan read"},
                {
                    "match": {"has_tools": True},
                    "tool_calls": [
                        {
                            "id": "c1",
                            "name": "lookup_flight_plan",
                            "arguments": {"flight_no": "CA1"},
                        }
                    ],
                },
            ]
        }
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_flight_plan",
                "parameters": {"type": "object", "properties": {"flight_no": {"type": "string"}}},
            },
        }
    ]
    model = ChatOpenAI(model="fake-1", base_url=fake_llm.url, api_key="k", max_retries=0)  # type: ignore[arg-type]
    reply = model.bind_tools(tools).invoke("what is CA1 doing?")
    assert reply.tool_calls == [
        {
            "name": "lookup_flight_plan",
            "args": {"flight_no": "CA1"},
            "id": "c1",
            "type": "tool_call",
        }
    ]
    observation: Any = {"role": "tool", "tool_call_id": "c1", "content": "STD 10:30"}
    after = client(fake_llm).chat.completions.create(
        model="fake-1",
        messages=[
            {"role": "user", "content": "what is CA1 doing?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_flight_plan", "arguments": "{}"},
                    }
                ],
            },
            observation,
        ],
    )
    assert after.choices[0].message.content == "plan read"


def test_streaming_sends_deltas_tool_calls_and_usage(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script(
        {
            "chunk_size": 4,
            "rules": [
                {
                    "content": "The fuel leak is at stand 105.",
                    "tool_calls": [{"name": "assess_risk", "arguments": {"level": "HIGH"}}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 12},
                }
            ],
        }
    )
    model = ChatOpenAI(
        model="fake-1",
        base_url=fake_llm.url,
        api_key="k",  # type: ignore[arg-type]
        max_retries=0,
        stream_usage=True,
    )
    chunks = list(model.stream("status?"))
    texts = [c.content for c in chunks if c.content]
    assert len(texts) == 8  # 30 characters, 4 per delta
    assert "".join(str(t) for t in texts) == "The fuel leak is at stand 105."
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["name"] == "assess_risk"
    assert merged.tool_calls[0]["args"] == {"level": "HIGH"}
    assert merged.usage_metadata is not None
    assert (merged.usage_metadata["input_tokens"], merged.usage_metadata["output_tokens"]) == (
        50,
        12,
    )
    assert fake_llm.requests[0]["body"]["stream"] is True


def test_latency_delays_the_reply(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"latency": 0.3, "rules": [{"content": "slow"}]})
    started = time.monotonic()
    assert ask(fake_llm, "x").choices[0].message.content == "slow"
    assert time.monotonic() - started >= 0.3  # a lower bound only: never a timing ceiling


def test_rate_limit_carries_retry_after(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"rules": [{"fault": "429", "retry_after": 2.5}]})
    with pytest.raises(openai.RateLimitError) as caught:
        ask(fake_llm, "x")
    assert caught.value.response.headers["retry-after"] == "2.5"


@pytest.mark.parametrize(
    ("status", "error"), [(500, openai.InternalServerError), (401, openai.AuthenticationError)]
)
def test_error_statuses(fake_llm: FakeLLMServer, status: int, error: type[Exception]) -> None:
    fake_llm.set_script({"rules": [{"status": status}]})
    with pytest.raises(error):
        ask(fake_llm, "x")


def test_a_hang_outlasts_the_client_timeout(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script({"rules": [{"fault": "hang"}]})
    with pytest.raises(openai.APITimeoutError):
        client(fake_llm, timeout=0.5).chat.completions.create(
            model="fake-1", messages=[{"role": "user", "content": "x"}]
        )


def test_invalid_json_content_and_invalid_body(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {"match": {"call": 1}, "fault": "invalid_json", "json": {"flight_no": "CA1234"}},
                {"match": {"call": 2}, "fault": "invalid_body"},
            ]
        }
    )
    content = ask(fake_llm, "x").choices[0].message.content
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)
    with pytest.raises(json.JSONDecodeError):  # what the SDK raises for a broken body
        ask(fake_llm, "x")


def test_malformed_tool_arguments_and_an_unknown_tool(fake_llm: FakeLLMServer) -> None:
    fake_llm.set_script(
        {
            "rules": [
                {
                    "match": {"call": 1},
                    "fault": "malformed_tool_args",
                    "tool_calls": [{"name": "close_taxiway", "arguments": {"taxiway": "A"}}],
                },
                {"match": {"call": 2}, "fault": "unknown_tool"},
            ]
        }
    )
    bad_args = ask(fake_llm, "x").choices[0].message.tool_calls[0]
    assert bad_args.function.name == "close_taxiway"
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad_args.function.arguments)
    unknown = ask(fake_llm, "x").choices[0].message.tool_calls[0]
    assert unknown.function.name == "launch_fireworks"


def test_a_script_with_a_mistake_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text("rules:\n  - fault: teapot\n", encoding="utf-8")
    with pytest.raises(ValueError, match="fault"):
        Script.load(path)
    path.write_text("rules: [\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not YAML/JSON"):
        Script.load(path)


def test_the_command_serves_a_script_file(tmp_path: Path) -> None:
    script = tmp_path / "demo.json"
    script.write_text(
        json.dumps({"models": ["demo-model"], "rules": [{"content": "from the file"}]}),
        encoding="utf-8",
    )
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "fake_llm", "--port", str(port), "--script", str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in banner
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as reply:
            assert json.load(reply)["data"][0]["id"] == "demo-model"
        openai_client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        )
        answer = openai_client.chat.completions.create(
            model="demo-model", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "from the file"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_command_refuses_a_bad_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("rules: [{latency: soon}]\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "manage.py", "fake_llm", "--port", "0", "--script", str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "latency" in result.stderr


def test_the_shipped_demo_script_is_valid() -> None:
    script = Script.load(ROOT / "scripts" / "fake_llm" / "demo.yaml")
    assert script.rules[0].fault == "429" and script.models == ["fake-1"]
