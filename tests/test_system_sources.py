"""Evidence sources per system (issue 36 item 1): an admin attaches a metrics source and
a code source (an MCP git server over a local repository) to the system; a session
started on the system's sources reads them (logs stay the bundle's), records which in
`diagnosis.requested`, and says so on its page, in its export and in the API's create;
a session on its bundle reads the bundle."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.urls import reverse

from aero.models import AuditLog
from diagnosis.actions import ActionError
from diagnosis.models import Event, LLMRequest, Session, ToolCall
from packs.diagnosis.models import MetricsSource, SystemSources
from packs.diagnosis.sessions import start_from_bundle, summarize
from tests.api_helpers import call, token_for
from tests.prometheus_helpers import prometheus_with
from tests.test_diagnosis_prometheus import without_metrics_file
from tools.models import McpServer

pytestmark = pytest.mark.services
EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
EXAMPLE = "ex-deploy-payments"
SAME = ("status", "root_cause", "confidence", "missing_sources", "problem_type")


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("example")
    with tarfile.open(EXAMPLES / f"{EXAMPLE}.tar.gz") as archive:
        archive.extractall(where, filter="data")
    (folder,) = [p for p in where.iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module")
def prometheus(unpacked: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with prometheus_with(unpacked / "metrics.csv", tmp_path_factory.mktemp("prom")) as url:
        yield url


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Path]:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield tmp_path / "stored"


@pytest.fixture
def attached(prometheus: str, unpacked: Path) -> SystemSources:
    """The shop's sources: its Prometheus and a git server of its own over its repository
    (the example's repo/, where the system's code lives)."""
    metrics = MetricsSource.objects.create(name="shop-prom", base_url=prometheus)
    server = McpServer.objects.create(
        name="shop-git",
        command="{python}",
        args=["-m", "mcp_server_git", "--repository", "{repo}"],
        call_timeout_seconds=20,
    )
    row = SystemSources(
        system="shop", metrics=metrics, code_server=server, repo_path=str(unpacked / "repo")
    )
    row.full_clean()
    row.save()
    return row


def test_an_admin_attaches_sources_to_a_system_and_bad_ones_are_refused(
    db: None, tmp_path: Path
) -> None:
    git = McpServer.objects.create(name="shop-git", command="{python}")
    with pytest.raises(ValidationError, match="No system is named airport"):
        SystemSources(system="airport").full_clean()
    with pytest.raises(ValidationError, match="needs both its git server and its repository"):
        SystemSources(system="shop", code_server=git).full_clean()
    with pytest.raises(ValidationError, match="Not an absolute path to a git repository"):
        SystemSources(system="shop", code_server=git, repo_path=str(tmp_path)).full_clean()
    root = User.objects.create_superuser("root", password="pw-for-tests")
    client = Client()
    client.force_login(root)
    url = reverse("admin:diagnosis_pack_systemsources_add")
    answer = client.post(url, {"system": "shop", "metrics": "", "code_server": "", "repo_path": ""})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert SystemSources.objects.get().system == "shop"
    assert AuditLog.objects.filter(action="system_sources.created").exists()


def test_a_session_on_the_systems_sources_reads_them_and_says_so(
    builtin: None,
    stored: Path,
    attached: SystemSources,
    make_user: Callable[..., User],
    tmp_path: Path,
    settings: Any,
) -> None:
    settings.AERO_LLM_WAITS = True  # the reads are waits the runner answers
    user = make_user("olga", "operator")
    from_bundle = summarize(
        start_from_bundle(user, EXAMPLES / f"{EXAMPLE}.tar.gz", {"producer": "test"})
    )
    folder = without_metrics_file(EXAMPLE, tmp_path / "x")
    session = start_from_bundle(user, folder, {"sources": "system", "producer": "test"})
    live = summarize(session)

    repo = attached.repo_path
    expected = {
        "sources": "system",
        "system": "shop",
        "code": {"server": "shop-git", "repo": repo},
        "logs": "bundle",
    }
    requested = Event.objects.get(session=session, type="diagnosis.requested").payload
    assert requested["evidence_from"] == expected and live["sources_from"] == expected
    assert requested["metrics"]["name"] == "shop-prom"
    assert from_bundle["sources_from"] == {"sources": "bundle"}
    assert {k: live[k] for k in SAME} == {k: from_bundle[k] for k in SAME}
    # The code came through the system's server over its repository.
    code = ToolCall.objects.get(session=session, tool_name="code")
    assert code.status == "completed" and code.response_payload["hunk"]
    read = LLMRequest.objects.get(session=session, purpose="tool:code_read")
    assert read.request["args"]["repo"] == repo and read.request["args"]["server"] == "shop-git"
    # The page and the export say where the evidence came from.
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert "the sources attached to the system shop" in page
    assert f"code through the MCP server shop-git over {repo}" in page
    url = f"/api/v1/diagnosis-sessions/{session.pk}/replay/export-md"
    export = call("POST", url, token_for(make_user("ada", "operator")))
    assert export.status_code == 200
    text = export.content.decode()
    assert "the sources attached to the system shop" in text and "Prometheus shop-prom" in text


def test_the_system_must_have_sources_and_not_both_choices(
    builtin: None, stored: Path, make_user: Callable[..., User], prometheus: str
) -> None:
    user = make_user("olga", "operator")
    bundle = EXAMPLES / f"{EXAMPLE}.tar.gz"
    with pytest.raises(ActionError, match="No sources are attached to the system shop"):
        start_from_bundle(user, bundle, {"sources": "system"})
    MetricsSource.objects.create(name="shop-prom", base_url=prometheus)
    SystemSources.objects.create(system="shop")
    with pytest.raises(ActionError, match="not both"):
        start_from_bundle(user, bundle, {"sources": "system", "metrics_source": "shop-prom"})
    assert not Session.objects.exists()


def test_the_api_create_takes_the_source_choice(
    builtin: None, stored: Path, attached: SystemSources, alice: User
) -> None:
    token = token_for(alice, "operator")

    def post(data: dict[str, Any]) -> Any:
        with (EXAMPLES / f"{EXAMPLE}.tar.gz").open("rb") as upload:
            return Client().post(
                "/api/v1/diagnosis-sessions",
                {"bundle": upload, **data},
                headers={"Authorization": f"Bearer {token}"},
            )

    created = post({"sources": "system"})
    assert created.status_code == 201, created.content
    session = Session.objects.get(pk=created.json()["session_id"])
    requested = Event.objects.get(session=session, type="diagnosis.requested").payload
    assert requested["evidence_from"]["sources"] == "system"
    assert requested["metrics"]["name"] == "shop-prom"

    chosen = post({"metrics_source": "shop-prom"})
    assert chosen.status_code == 201, chosen.content
    requested = Event.objects.get(
        session_id=chosen.json()["session_id"], type="diagnosis.requested"
    ).payload
    assert requested["evidence_from"] == {"sources": "bundle"}
    assert requested["metrics"]["name"] == "shop-prom"

    assert post({"sources": "everywhere"}).status_code == 422
    both = post({"sources": "system", "metrics_source": "shop-prom"})
    assert both.status_code == 422 and "not both" in both.json()["detail"]
    assert Session.objects.count() == 2
    schema = json.loads(Client().get("/api/v1/openapi.json").content)
    text = json.dumps(schema)
    assert '"sources"' in text and '"metrics_source"' in text


def _cli(capsys: pytest.CaptureFixture[str], *options: str) -> dict[str, Any]:
    from django.core.management import call_command

    capsys.readouterr()
    call_command("incident", "run", *options, "--json")
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_without_a_bundle_a_session_on_the_systems_sources_concludes_saying_what_it_lacked(
    builtin: None,
    stored: Path,
    attached: SystemSources,
    capsys: pytest.CaptureFixture[str],
    make_user: Callable[..., User],
) -> None:
    """No bundle at all (the CLI's `--sources system` with a description and the window):
    metrics from the system's Prometheus, no logs; the session runs to its conclusion,
    whose missing sources name what it lacked, and the page, the export and the JSON say
    where its evidence came from."""
    result = _cli(
        capsys,
        "--sources", "system",
        "--message", "payment callbacks fail",
        "--until", "2026-10-02T11:20:00+08:00",
    )  # fmt: skip
    assert result["status"] in ("waiting_user", "completed"), result
    assert result["sources_from"] == {
        "sources": "system",
        "system": "shop",
        "code": {"server": "shop-git", "repo": attached.repo_path},
        "logs": "none",
    }
    assert result["metrics"]["name"] == "shop-prom"
    assert "logs" in result["missing_sources"], result["missing_sources"]
    calls = {c.tool_name: c for c in ToolCall.objects.filter(session_id=result["session"])}
    assert calls["anomalies"].status == "completed"  # read from Prometheus
    assert calls["anomalies"].response_payload["anomalies"], calls["anomalies"].response_payload
    assert "log_signatures" not in calls
    cause = Event.objects.get(
        session_id=result["session"], type="finding.recorded", payload__kind="root_cause"
    ).payload
    assert cause["missing"] == result["missing_sources"]
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = client.get(reverse("diagnosis:session-detail", args=[result["session"]]))
    text = page.content.decode()
    assert "the sources attached to the system shop" in text and "no logs (no bundle)" in text
    url = f"/api/v1/diagnosis-sessions/{result['session']}/replay/export-md"
    export = call("POST", url, token_for(make_user("ada", "operator"))).content.decode()
    assert "no logs (no bundle)" in export and "Prometheus shop-prom" in export


def test_the_form_and_the_cli_offer_the_systems_sources_and_refuse_when_none(
    builtin: None, stored: Path, alice: User, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management.base import CommandError

    client = Client()
    client.force_login(alice)
    form = client.get(reverse("diagnosis_pack:new")).content.decode()
    assert 'name="sources"' in form and "the sources attached to the system" in form
    answer = client.post(
        reverse("diagnosis_pack:new"), {"sources": "system", "description": "checkout is slow"}
    )
    assert answer.status_code == 400
    assert "No sources are attached to the system shop." in answer.content.decode()
    with pytest.raises(CommandError, match="No sources are attached to the system shop"):
        _cli(capsys, "--sources", "system", "--message", "checkout is slow")
    with pytest.raises(CommandError, match="Upload a bundle, or choose the system's sources"):
        _cli(capsys, "--sources", "bundle", "--message", "checkout is slow")
    assert not Session.objects.exists()


def test_the_form_starts_a_session_on_the_systems_sources_without_a_bundle(
    builtin: None, stored: Path, attached: SystemSources, alice: User
) -> None:
    client = Client()
    client.force_login(alice)
    answer = client.post(
        reverse("diagnosis_pack:new"), {"sources": "system", "description": "checkout is slow"}
    )
    assert answer.status_code == 302, answer.content.decode()[:3000]
    session = Session.objects.get()
    requested = Event.objects.get(session=session, type="diagnosis.requested").payload
    assert requested["evidence_from"]["sources"] == "system"
    assert requested["evidence_from"]["logs"] == "none"
    page = client.get(answer["Location"]).content.decode()
    assert "the sources attached to the system shop" in page and "no logs (no bundle)" in page


def test_the_api_opens_a_session_on_the_systems_sources_without_a_bundle(
    builtin: None, stored: Path, attached: SystemSources, alice: User
) -> None:
    """The API's create as the CLI's `--sources system`: no file, the description and the
    window are the incident; without the system's sources the file is required, and a
    window beside a bundle is refused (the bundle has its own). Nothing is created on a
    refusal."""
    token = token_for(alice, "operator")

    def post(data: dict[str, Any]) -> Any:
        return Client().post(
            "/api/v1/diagnosis-sessions", data, headers={"Authorization": f"Bearer {token}"}
        )

    missing = post({"description": "checkout is slow"})
    assert missing.status_code == 422 and "bundle" in missing.content.decode()
    unsaid = post({"sources": "system"})
    assert unsaid.status_code == 422 and "describe the incident" in unsaid.json()["detail"]
    backwards = post(
        {
            "sources": "system",
            "description": "payment callbacks fail",
            "since": "2026-10-02T11:20:00+08:00",
            "until": "2026-10-02T10:20:00+08:00",
        }
    )
    assert (
        backwards.status_code == 422 and "since must be before until" in backwards.content.decode()
    )
    with (EXAMPLES / f"{EXAMPLE}.tar.gz").open("rb") as upload:
        windowed = post({"bundle": upload, "since": "2026-10-02T10:20:00+08:00"})
    assert windowed.status_code == 422 and "go without one" in windowed.content.decode()
    assert not Session.objects.exists()

    created = post(
        {
            "sources": "system",
            "description": "payment callbacks fail",
            "until": "2026-10-02T11:20:00+08:00",
        }
    )
    assert created.status_code == 201, created.content
    requested = Event.objects.get(
        session_id=created.json()["session_id"], type="diagnosis.requested"
    ).payload
    assert requested["evidence_from"]["logs"] == "none"
    assert requested["evidence_from"]["sources"] == "system"
    assert requested["metrics"]["name"] == "shop-prom"


def _commit(repo: Path, at: str, message: str, files: dict[str, str]) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    env = {"GIT_AUTHOR_DATE": at, "GIT_COMMITTER_DATE": at, "PATH": os.environ["PATH"]}
    git = ["git", "-C", str(repo), "-c", "user.name=li.wei", "-c", "user.email=li@shop.example"]
    subprocess.run([*git, "add", *files], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", message], check=True, env=env)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()


HANDLERS = "".join(f"def handler_{n}(request):\n    return {{'n': {n}}}\n\n" for n in range(1, 9))


@pytest.fixture
def shop_repo(tmp_path: Path) -> dict[str, Any]:
    """A small git repository of the shop made here (the incident's window is 09:20-11:20
    on 2 October): its code a month before; a change to payments at 09:00, before the
    window; one to search at 10:35, inside it (search stays calm); and at 10:53 the
    commit that breaks payments' callbacks (a new function from line 25)."""
    repo = tmp_path / "shop-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    shas = {
        "initial": _commit(
            repo,
            "2026-09-02T09:20:00+08:00",
            "initial import",
            {"payments/app/handlers.py": HANDLERS, "search/app/help.py": "HELP = 'search'\n"},
        ),
        "before": _commit(
            repo,
            "2026-10-02T09:00:00+08:00",
            "payments: a comment on the handlers",
            {"payments/app/handlers.py": "# the payment handlers\n" + HANDLERS},
        ),
        "search": _commit(
            repo,
            "2026-10-02T10:35:00+08:00",
            "search: copy edits in help texts",
            {"search/app/help.py": "HELP = 'search the shop'\n"},
        ),
    }
    lines = ("# the payment handlers\n" + HANDLERS).splitlines(keepends=True)
    fault = "def verify_callback(request):\n    return request.body['signature']\n\n"
    shas["fault"] = _commit(
        repo,
        "2026-10-02T10:53:00+08:00",
        "payments: verify_callback reads the signature",
        {"payments/app/handlers.py": "".join(lines[:24]) + fault + "".join(lines[24:])},
    )
    return {"path": repo, **shas}


def test_without_a_bundle_the_session_blames_the_commit_in_the_window_through_mcp(
    builtin: None,
    stored: Path,
    attached: SystemSources,
    shop_repo: dict[str, Any],
    make_user: Callable[..., User],
    settings: Any,
) -> None:
    """No bundle, so no deploy record: the session reads the system repository's recent
    commits through its MCP git server (git_log over the window, git_show of each), and
    blames the one that changed the anomalous service's code inside the window, citing
    its commit, file and line (read again through MCP as the code tool); the change to
    the same service before the window and the one to a calm service are not blamed."""
    settings.AERO_LLM_WAITS = True  # the reads are waits the runner answers
    attached.repo_path = str(shop_repo["path"])
    attached.save()
    session = start_from_bundle(
        make_user("olga", "operator"),
        None,
        {
            "sources": "system",
            "description": "payment callbacks fail",
            "until": "2026-10-02T11:20:00+08:00",
            "producer": "test",
        },
    )
    result = summarize(Session.objects.get(pk=session.pk))
    cause = Event.objects.get(
        session=session, type="finding.recorded", payload__kind="root_cause"
    ).payload
    assert (cause["hypothesis"], cause["service"]) == ("bad_commit", "payments"), cause
    assert cause["commit"] == shop_repo["fault"]
    # One commit is a candidate: the earlier change to payments is outside the window.
    candidates = Event.objects.filter(
        session=session, type="finding.recorded", payload__kind="hypothesis"
    ).values_list("payload__hypothesis", "payload__service")
    assert list(candidates).count(("bad_commit", "payments")) == 1, list(candidates)
    assert result["code_locations"] == [{"path": "payments/app/handlers.py", "line": 25}]
    assert cause["code_locations"][0]["commit"] == shop_repo["fault"]
    assert cause["code_locations"][0]["function"] == "def verify_callback"
    assert "changes" not in cause["missing"] and "logs" in cause["missing"]
    assert "ev-commits" in cause["evidence"]
    assert result["actions"][0]["args"] == {
        "service": "payments",
        "commit": shop_repo["fault"][:10],
    }

    calls = {c.call_id: c for c in ToolCall.objects.filter(session=session)}
    listed = {c["commit"]: c for c in calls["ev-commits"].response_payload["commits"]}
    # The window and the change window before it were read: all three, the old one too.
    assert set(listed) == {shop_repo["fault"], shop_repo["search"], shop_repo["before"]}
    assert listed[shop_repo["search"]]["services"] == ["search"]
    assert shop_repo["initial"] not in listed
    # Through the system's server: the log and the shows, then the blamed hunk.
    reads = LLMRequest.objects.filter(session=session, purpose="tool:commits_read").get()
    assert reads.request["args"]["server"] == "shop-git"
    assert reads.request["args"]["repo"] == str(shop_repo["path"])
    code = calls["ev-code-1"]
    assert code.status == "completed"
    assert "+def verify_callback(request):" in code.response_payload["hunk"]

    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert shop_repo["fault"][:10] in page and "payments/app/handlers.py:25" in page
    assert "Recent commits (MCP git)" in page


def test_without_a_bundle_a_failing_git_server_fails_the_commits_call_and_the_session_goes_on(
    builtin: None,
    stored: Path,
    attached: SystemSources,
    shop_repo: dict[str, Any],
    make_user: Callable[..., User],
    settings: Any,
) -> None:
    settings.AERO_TOOL_RETRIES = 0
    attached.repo_path = str(shop_repo["path"])
    attached.save()
    McpServer.objects.filter(name="shop-git").update(command="no-such-git-server")
    session = start_from_bundle(
        make_user("olga", "operator"),
        None,
        {
            "sources": "system",
            "description": "payment callbacks fail",
            "until": "2026-10-02T11:20:00+08:00",
            "producer": "test",
        },
    )
    commits = ToolCall.objects.get(session=session, call_id="ev-commits")
    assert commits.status == "failed" and "not found" in commits.error, commits.error
    cause = Event.objects.get(
        session=session, type="finding.recorded", payload__kind="root_cause"
    ).payload
    assert cause["hypothesis"] != "bad_commit" and not cause.get("commit")
    assert "changes" in cause["missing"]
