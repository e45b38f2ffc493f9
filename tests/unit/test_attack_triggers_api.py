"""Attacks on the trigger routes of the embedded app (`flowtide ui`'s, in process, the
same routers the server mounts): odd names, far times, secrets in definitions shown to
readers, server-local files named as playbooks, and webhook deliveries built to crash
or stall the server. Each answer is a 4xx that says why, never a 500 or a hang."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.store.sqlite import SQLiteStore
from flowtide.triggers.hooks import sign
from flowtide.ui.local import create_local_app
from flowtide.web.hooks import HookDesk

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"
SECRET = b"attack-hook-secret-9f8e7d"
NOOP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: noop, path: tests/attack/noop}
workflow:
  - step: start
    tool: {kind: noop}
"""


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    app.state.hooks = HookDesk()
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        r = c.post("/api/catalog/register", json={"content": NOOP})
        assert r.status_code in (200, 201), r.text
        yield c
    store.close()


def _deliver(client: TestClient, name: str, body: bytes, **headers: str) -> Any:
    sent = {
        "content-type": "application/json",
        "x-flowtide-signature": sign(SECRET, body),
        "authorization": "",
        **headers,
    }
    return client.post(f"/api/hooks/{name}", content=body, headers=sent)


def _hook(client: TestClient, name: str = "gh", **fields: Any) -> None:
    r = client.post(
        "/api/hooks",
        json={"name": name, "playbook": "tests/attack/noop", "secret": SECRET.decode(), **fields},
    )
    assert r.status_code == 201, r.text


# -- subscriptions: a URL's credentials ------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "nats://alice:pw-in-url-1@127.0.0.1:9",
        "alice:pw-in-url-1@127.0.0.1:9",  # no scheme: nats-py adds nats://
        "127.0.0.1:9,alice:pw-in-url-1@127.0.0.1:10",
        " tls://pw-in-url-1@127.0.0.1:9",
    ],
)
def test_a_subscription_url_with_credentials_is_refused(client: TestClient, url: str) -> None:
    r = client.post(
        "/api/subscriptions",
        json={"name": "s", "playbook": "tests/attack/noop", "url": url, "subject": "a.b"},
    )
    assert r.status_code == 400, r.text
    assert "credential" in r.text
    assert "pw-in-url-1" not in client.get("/api/subscriptions").text


# -- schedules: far times, odd names ------------------------------------------------------


@pytest.mark.parametrize("key", ["start", "end"])
def test_a_schedule_at_1e300_is_a_400_not_a_hung_server(client: TestClient, key: str) -> None:
    began = time.monotonic()
    r = client.post(
        "/api/schedules",
        json={"name": "far", "playbook": "tests/attack/noop", "every": "1ms", key: 1e300},
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == key, r.text
    assert client.get("/api/schedules").json()["items"] == []
    assert time.monotonic() - began < 10


@pytest.mark.parametrize(
    ("start", "end"),
    [(-1e300, 0), (0, 1e300), ("0001-01-01T00:00:00Z", "2000-01-01T00:00:00Z"), (0, 3e9)],
)
def test_a_backfill_over_a_far_range_is_a_400(client: TestClient, start: Any, end: Any) -> None:
    r = client.post(
        "/api/schedules",
        json={"name": "daily", "playbook": "tests/attack/noop", "cron": "0 0 * * *"},
    )
    assert r.status_code == 201, r.text
    r = client.post("/api/schedules/daily/backfill", json={"start": start, "end": end})
    assert r.status_code == 400, r.text
    assert client.get("/api/executions").json()["items"] == []


@pytest.mark.parametrize(
    "name",
    ["a/b", "..", "a\x00b", "a\ud800", "x" * 100_000, "-lead", "ä", "a b", "a%2Fb", ""],
)
def test_odd_schedule_names_are_refused(client: TestClient, name: str) -> None:
    body = json.dumps(
        {"name": name, "playbook": "tests/attack/noop", "every": "1h"}, ensure_ascii=True
    )
    r = client.post("/api/schedules", content=body, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert client.get("/api/schedules").json()["items"] == []


@pytest.mark.parametrize("path", ["..%2F..%2Fetc%2Fpasswd", "a%00b", "%2e%2e", "x" * 5000])
def test_odd_names_in_paths_are_404_or_422(client: TestClient, path: str) -> None:
    for route in ("schedules", "hooks", "subscriptions"):
        r = client.get(f"/api/{route}/{path}")
        assert r.status_code in (404, 422), (route, r.status_code, r.text)
    r = client.post(f"/api/schedules/{path}/trigger")
    assert r.status_code in (404, 422), r.text


# -- a server-local file named as a playbook -----------------------------------------------


@pytest.mark.parametrize("route", ["schedules", "subscriptions"])
def test_a_server_file_is_not_a_playbook_and_its_existence_is_not_told(
    client: TestClient, tmp_path: Path, route: str
) -> None:
    there = tmp_path / "master-like"
    there.write_text("not a playbook")
    answers = []
    for path in (str(there), str(tmp_path / "missing-file"), "/etc/passwd", "../../etc/passwd"):
        fields: dict[str, Any] = {"name": "f", "playbook": path}
        fields.update(
            {"every": "1h"}
            if route == "schedules"
            else {"url": "nats://127.0.0.1:9", "subject": "a"}
        )
        r = client.post(f"/api/{route}", json=fields)
        assert r.status_code == 400, r.text
        answers.append(r.json()["error"]["message"].replace(path, "PATH"))
    # The same answer whether the file exists or not: the API is no file-system oracle.
    assert len(set(answers)) == 1, answers


# -- webhooks: deliveries built to crash or stall ----------------------------------------


def test_json_nested_deeper_than_the_parser_goes_is_a_400(client: TestClient) -> None:
    _hook(client)
    r = _deliver(client, "gh", b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400, r.text
    assert client.get("/api/executions").json()["items"] == []


def test_a_form_of_100k_fields_is_parsed_or_refused_quickly(client: TestClient) -> None:
    _hook(client)
    body = "&".join(f"f{i}=v" for i in range(100_000)).encode()
    began = time.monotonic()
    r = _deliver(client, "gh", body, **{"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code in (202, 400, 413), r.text
    assert time.monotonic() - began < 10


@pytest.mark.parametrize(
    "signature",
    [
        lambda s: s.upper().replace("SHA256=", "sha256="),  # upper-case hex: same digest
        lambda s: "  " + s + "  ",
        lambda s: s.replace("sha256=", "SHA256="),
    ],
)
def test_signature_spellings_that_are_the_same_signature(
    client: TestClient, signature: Any
) -> None:
    _hook(client)
    body = b'{"a": 1}'
    r = _deliver(client, "gh", body, **{"x-flowtide-signature": signature(sign(SECRET, body))})
    assert r.status_code == 202, r.text


@pytest.mark.parametrize(
    "given",
    [
        lambda s: "sha1=" + s[len("sha256=") :][:40],
        lambda s: s[len("sha256=") :],  # no scheme
        lambda s: s + "00",
        lambda s: s[:-2],
        lambda s: s + "," + s,
        lambda s: "sha256=" + s,
        lambda s: s.replace("sha256=", "sha256 = "),
    ],
)
def test_signature_variants_that_are_not_the_signature_are_401(
    client: TestClient, given: Any
) -> None:
    _hook(client)
    body = b'{"a": 1}'
    r = _deliver(client, "gh", body, **{"x-flowtide-signature": given(sign(SECRET, body))})
    assert r.status_code == 401, r.text


def test_a_timestamp_far_in_the_future_or_huge_is_refused(client: TestClient) -> None:
    _hook(client)
    body = b"{}"
    for stamp in (int(time.time()) + 10 * 86400, 10**30, -(10**30)):
        r = _deliver(
            client,
            "gh",
            body,
            **{
                "x-flowtide-signature": sign(SECRET, body, stamp),
                "x-flowtide-timestamp": str(stamp),
            },
        )
        assert r.status_code == 401, (stamp, r.text)
    r = _deliver(client, "gh", body, **{"x-flowtide-timestamp": "9" * 5000})
    assert r.status_code == 401, r.text


def test_a_10kb_delivery_id_is_a_400(client: TestClient) -> None:
    _hook(client)
    r = _deliver(client, "gh", b"{}", **{"x-flowtide-delivery": "d" * 10_000})
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "template",
    [
        "{{ env }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ secret }}",
        "{{ self.__init__.__globals__ }}",
        "{{ lipsum.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.environ }}",
        "{{ range(10**9) | list }}",
        "{{ 'x' * 10**9 }}",
    ],
)
def test_a_hook_workload_template_cannot_reach_the_server(
    client: TestClient, template: str
) -> None:
    _hook(client, workload={"x": template})
    r = _deliver(client, "gh", b"{}")
    assert r.status_code == 409, r.text
    assert client.get("/api/executions").json()["items"] == []


@pytest.mark.parametrize(("depth", "status"), [(200, 202), (300, 400), (900, 400)])
def test_json_nested_deeper_than_a_workload_may_be_is_a_400(
    client: TestClient, depth: int, status: int
) -> None:
    # 900 parsed, then made the run's start recurse past Python's limit: a 500.
    _hook(client)
    r = _deliver(client, "gh", b"[" * depth + b"]" * depth)
    assert r.status_code == status, r.text


def test_a_nats_message_too_deep_for_a_workload_is_its_text() -> None:
    from flowtide.triggers.natssource import message_data

    for depth in (300, 100_000):
        raw = b"[" * depth + b"]" * depth
        assert message_data(raw) == raw.decode()
    assert message_data(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    assert message_data(b"[" * 200 + b"]" * 200) == eval("[" * 200 + "]" * 200)


def test_an_unknown_hook_name_costs_what_a_known_one_does(tmp_path: Path) -> None:
    # Known names were kept for _FRESH s; unknown ones read the store on every request:
    # a flood of made-up names was a store read each, and timing told names apart.
    import asyncio

    from flowtide.web.hooks import HookDesk as Desk

    store = SQLiteStore(tmp_path / "flowtide.db")
    reads: list[str] = []
    real = store.get_trigger

    def counted(kind: str, name: str) -> Any:
        reads.append(name)
        return real(kind, name)

    store.get_trigger = counted  # type: ignore[method-assign]
    now = [100.0]
    desk = Desk(monotonic=lambda: now[0])

    async def probe() -> None:
        for _ in range(50):
            assert await desk.hook(store, "nobody") is None
        assert reads == ["nobody"]
        now[0] += 5.0  # past _FRESH: read again, once
        for _ in range(50):
            assert await desk.hook(store, "nobody") is None
        assert reads == ["nobody", "nobody"]
        desk.forget("nobody")  # a hook of that name was just added: read at once
        assert await desk.hook(store, "nobody") is None
        assert len(reads) == 3
        for i in range(12_000):  # many names: the memory of them stays bounded
            desk._unknown[f"n{i}"] = now[0]
        await desk.hook(store, "another")
        assert len(desk._unknown) <= 10_000

    try:
        asyncio.run(probe())
    finally:
        store.close()


# -- definitions: versions, nesting, sizes --------------------------------------------------


def test_a_schedule_names_a_catalog_version(client: TestClient) -> None:
    # `version` beside `playbook` (the API, `--version`) was an "unknown field" 400.
    r = client.post(
        "/api/schedules",
        json={"name": "v", "playbook": "tests/attack/noop", "version": 1, "every": "1h"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["version"] == 1
    r = client.post(
        "/api/schedules",
        json={"name": "v2", "playbook": "tests/attack/noop", "version": 7, "every": "1h"},
    )
    assert r.status_code == 400 and "version 7" in r.text, r.text


@pytest.mark.parametrize("version", [2**31, 2**63, 10**30])
def test_a_version_past_the_store_integer_is_refused(client: TestClient, version: int) -> None:
    # A subscription's was a 503 "store unavailable" (SQLite cannot bind the integer).
    for route, extra in (
        ("schedules", {"every": "1h"}),
        ("subscriptions", {"url": "nats://127.0.0.1:9", "subject": "a", "paused": True}),
    ):
        r = client.post(
            f"/api/{route}",
            json={"name": "v", "playbook": "tests/attack/noop", "version": version, **extra},
        )
        assert r.status_code in (400, 422), (route, r.text)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [65, 900])
def test_a_definition_nested_too_deep_is_refused_and_lists_still_answer(
    client: TestClient, depth: int
) -> None:
    # 900 levels: the schedule's copy and the hook's answer recursed too deep (500s); the
    # hook was stored first, so listing hooks failed from then on.
    deep = _nested(depth)
    bodies = {
        "schedules": b'{"name":"d","playbook":"tests/attack/noop","every":"1h","workload":{"a":'
        + deep
        + b"}}",
        "hooks": b'{"name":"d","playbook":"tests/attack/noop","secret":"xxxxxxxx","workload":{"a":'
        + deep
        + b"}}",
        "subscriptions": b'{"name":"d","playbook":"tests/attack/noop","url":"nats://127.0.0.1:9",'
        b'"subject":"a","paused":true,"config":{"a":' + deep + b"}}",
    }
    for route, body in bodies.items():
        r = client.post(f"/api/{route}", content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), (route, r.status_code, r.text)
        assert "deep" in r.text, r.text
        listed = client.get(f"/api/{route}")
        assert listed.status_code == 200 and listed.json()["items"] == [], listed.text


def test_a_subscription_config_or_workload_is_bounded(client: TestClient) -> None:
    for key, value in (("config", {"k": "v" * 300_000}), ("workload", {"k": "v" * 300_000})):
        r = client.post(
            "/api/subscriptions",
            json={
                "name": "big",
                "playbook": "tests/attack/noop",
                "url": "nats://127.0.0.1:9",
                "subject": "a",
                "paused": True,
                key: value,
            },
        )
        assert r.status_code == 400 and r.json()["error"]["field"] == key, r.text


def test_a_hook_workload_is_bounded(client: TestClient) -> None:
    r = client.post(
        "/api/hooks",
        json={
            "name": "big",
            "playbook": "tests/attack/noop",
            "secret": "xxxxxxxx",
            "workload": {"k": "v" * 300_000},
        },
    )
    assert r.status_code in (400, 422), r.text


@pytest.mark.parametrize("max_deliver", [0, 10**30, 10_001])
def test_max_deliver_is_bounded(client: TestClient, max_deliver: int) -> None:
    r = client.post(
        "/api/subscriptions",
        json={
            "name": "m",
            "playbook": "tests/attack/noop",
            "url": "nats://127.0.0.1:9",
            "subject": "a",
            "paused": True,
            "max_deliver": max_deliver,
        },
    )
    assert r.status_code in (400, 422), r.text


def test_bad_signatures_do_not_spend_the_senders_rate(client: TestClient) -> None:
    # The rate is taken only after the signature verifies: someone without the secret
    # cannot use up the real sender's deliveries.
    _hook(client, rate="1/h")
    for _ in range(20):
        r = _deliver(client, "gh", b"{}", **{"x-flowtide-signature": "sha256=" + "0" * 64})
        assert r.status_code == 401
    assert _deliver(client, "gh", b"{}").status_code == 202
    assert _deliver(client, "gh", b'{"b": 1}').status_code == 429


def test_the_forwarded_header_is_no_way_around_a_token(client: TestClient) -> None:
    for method, path in (
        ("POST", "/api/schedules"),
        ("GET", "/api/hooks"),
        ("POST", "/api/hooks/gh/pause"),
        ("DELETE", "/api/hooks/gh"),
        ("GET", "/api/subscriptions"),
    ):
        r = client.request(
            method,
            path,
            json={},
            headers={"authorization": "", "x-flowtide-forwarded": "1"},
        )
        assert r.status_code == 401, (method, path, r.status_code)


@pytest.mark.parametrize(
    "source", ["os", "subprocess", "flowtide", "nats.aio", "../x", "Os", "x" * 65]
)
def test_a_source_is_a_known_name_never_a_module(client: TestClient, source: str) -> None:
    # Only `nats` and installed plugins' entry points (none here) are sources: a name is
    # never imported.
    r = client.post(
        "/api/subscriptions",
        json={
            "name": "src",
            "playbook": "tests/attack/noop",
            "source": source,
            "paused": True,
            "config": {"path": "/etc/passwd"},
        },
    )
    assert r.status_code in (400, 422) and "source" in r.text, r.text


def test_a_delivery_is_forwarded_to_its_shard_only_once_signed(client: TestClient) -> None:
    # On a cluster of several shards a delivery to another shard's hook was forwarded
    # before its signature was checked: an unknown name answered at once and a known one
    # a network hop later (names told apart), and every forged delivery cost a forward.
    from fastapi.responses import JSONResponse

    _hook(client)
    app = client.app
    local = app.state.reads  # type: ignore[attr-defined]
    forwarded: list[str] = []

    class Sharded:
        def __getattr__(self, name: str) -> Any:
            return getattr(local, name)

        async def trigger_elsewhere(self, request: Any, trigger_id: int) -> Any:
            forwarded.append(request.url.path)
            return JSONResponse({"forwarded": True}, status_code=202)

    app.state.reads = Sharded()  # type: ignore[attr-defined]
    try:
        bad = _deliver(client, "gh", b"{}", **{"x-flowtide-signature": "sha256=" + "0" * 64})
        assert bad.status_code == 401 and forwarded == []
        unknown = _deliver(client, "nobody", b"{}")
        assert unknown.status_code == 401 and forwarded == []
        good = _deliver(client, "gh", b"{}")
        assert good.status_code == 202 and good.json() == {"forwarded": True}
        assert forwarded == ["/api/hooks/gh"]
    finally:
        app.state.reads = local  # type: ignore[attr-defined]
