"""The Subscriptions page of `flowtide ui` in a real Chromium, against a real nats-server
(loopback): a stream's messages as squares coloured by their runs, a batched subscription,
a message whose playbook cannot start shown refused with why, the server's URL without
credentials; an operator pauses and resumes one, a reader gets no buttons."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

pytestmark = pytest.mark.nats

TICK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/ui/subscribed}
workload: {n: none}
workflow:
  - step: start
    tool: {kind: noop}
"""


async def _publish(url: str, stream: str, subject: str, bodies: list[Any]) -> None:
    import nats as nats_py

    nc = await nats_py.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[subject])
        for body in bodies:
            await js.publish(subject, json.dumps(body).encode())
    finally:
        await nc.close()


@pytest.fixture
def subscribed_ui(ft: Flowtide, tmp_path: Path) -> Iterator[tuple[LocalUi, NatsServer]]:
    nats = NatsServer.start(tmp_path / "nats")
    try:
        (tmp_path / "tick.yaml").write_text(TICK)
        ft.ok("catalog", "register", tmp_path / "tick.yaml")
        ft.ok(
            "subscription", "add", "orders", "tests/ui/subscribed", "--url", nats.url,
            "--stream", "ORDERS", "--set", "n={{ message.data.n }}",
            "--description", "one run per order",
        )  # fmt: skip
        ft.ok(
            "subscription", "add", "batched", "tests/ui/subscribed", "--url", nats.url,
            "--stream", "BATCHED", "--batch", "3", "--rate", "50/s",
        )  # fmt: skip
        # A playbook file that will not load: its message is refused with why.
        broken = tmp_path / "broken.yaml"
        broken.write_text(TICK.replace("tests/ui/subscribed", "tests/ui/broken"))
        ft.ok(
            "subscription", "add", "broken", broken, "--url", nats.url,
            "--stream", "BROKEN", "--max-deliver", "1",
        )  # fmt: skip
        broken.write_text("workflow: [ {step: start, tool: {kind: nosuchkind}} ]\n")
        asyncio.run(_publish(nats.url, "ORDERS", "orders.new", [{"n": i} for i in range(4)]))
        asyncio.run(_publish(nats.url, "BATCHED", "batched.new", [{"n": i} for i in range(6)]))
        asyncio.run(_publish(nats.url, "BROKEN", "broken.new", [{"n": 0}]))
        with local_ui(ft, tmp_path / "ui.out") as ui:
            yield ui, nats
    finally:
        nats.stop()


def _firings(ui: LocalUi, name: str) -> list[dict[str, Any]]:
    return list(ui.get(f"/api/subscriptions/{name}")["firings"])


@needs_chromium
def test_the_subscriptions_page(subscribed_ui: tuple[LocalUi, NatsServer]) -> None:
    ui, nats = subscribed_ui
    wait_until(
        lambda: [f["execution_status"] for f in _firings(ui, "orders")] == ["completed"] * 4,
        timeout=30,
        what="four runs of orders",
    )
    wait_until(
        lambda: (
            [f["execution_status"] for f in ui.get("/api/subscriptions/batched")["runs"]]
            == ["completed"] * 2
        ),
        timeout=30,
        what="the batches",
    )
    wait_until(
        lambda: [f["status"] for f in _firings(ui, "broken")] == ["failed"],
        timeout=30,
        what="the refused message",
    )
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(SEEN_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        ui.sign_in(page)
        page.get_by_test_id("nav-subscriptions").click()
        orders = page.locator('[data-testid="subscription"][data-name="orders"]')
        orders.get_by_test_id("subscription-state").get_by_text("listening").wait_for()
        completed = orders.locator('[data-testid="square"][data-status="completed"]')
        completed.nth(3).wait_for()
        assert completed.count() == 4
        # Each square links to the run it started.
        first_run = _firings(ui, "orders")[-1]["execution_id"]
        assert completed.first.get_attribute("href") == f"/ui/executions/{first_run}"
        text = orders.inner_text()
        assert nats.url in text and "ORDERS" in text and "flowtide-sub-orders" in text, text
        assert "one run per message" in text and "one run per order" in text
        batched = page.locator('[data-testid="subscription"][data-name="batched"]')
        assert "batches of up to 3" in batched.inner_text()
        assert "at most 50/s" in batched.inner_text()
        # One square per batch: 6 messages, batches of up to 3.
        runs = batched.locator('[data-testid="square"][data-status="completed"]')
        runs.nth(1).wait_for()
        assert runs.count() == 2 and "BATCHED:1-3" in (runs.first.get_attribute("title") or "")
        broken = page.locator('[data-testid="subscription"][data-name="broken"]')
        broken.locator('[data-testid="square"][data-status="refused"]').wait_for()
        refused = broken.get_by_test_id("refused-row")
        assert "BROKEN:1" in refused.inner_text() and "nosuchkind" in refused.inner_text()
        shot(page, "local-subscriptions")
        # A narrow window wraps the long refusal and the URLs: nothing wider than it.
        page.set_viewport_size({"width": 720, "height": 900})
        shot(page, "local-subscriptions-narrow")
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
        page.set_viewport_size({"width": 1400, "height": 900})

        orders.get_by_test_id("pause").click()
        orders.get_by_test_id("subscription-state").get_by_text("paused").wait_for()
        orders.get_by_test_id("resume").wait_for()
        assert ui.get("/api/subscriptions/orders")["paused"] is True
        orders.get_by_test_id("resume").click()
        orders.get_by_test_id("subscription-state").get_by_text("listening").wait_for()
        assert ui.get("/api/subscriptions/orders")["paused"] is False
        # A run says which subscription started it, a link back to this page.
        page.goto(f"{ui.url}/executions/{first_run}")
        badge = page.get_by_test_id("trigger-badge")
        assert badge.inner_text() == "by subscription orders"
        badge.click()
        page.wait_for_url(re.compile(r"/ui/subscriptions$"))
        page.locator('[data-testid="subscription"][data-name="orders"]').wait_for()
        assert errors == []

        # A reader sees the same page without the buttons (the API refuses them anyway).
        reader = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        reader.set_default_timeout(SEEN_MS)
        reader.route(
            "**/api/whoami",
            lambda route: route.fulfill(json={"name": "viewer", "role": "reader"}),
        )
        ui.sign_in(reader)
        reader.get_by_test_id("nav-subscriptions").click()
        shown = reader.locator('[data-testid="subscription"][data-name="orders"]')
        shown.locator('[data-testid="square"][data-status="completed"]').nth(3).wait_for()
        assert reader.locator('[data-testid="pause"], [data-testid="resume"]').count() == 0


@needs_chromium
def test_no_subscriptions_yet(ft: Flowtide, tmp_path: Path) -> None:
    with local_ui(ft, tmp_path / "ui.out") as ui, chromium() as browser:
        page = browser.new_context(viewport={"width": 1100, "height": 700}).new_page()
        page.set_default_timeout(SEEN_MS)
        ui.sign_in(page)
        page.get_by_test_id("nav-subscriptions").click()
        page.get_by_test_id("subscriptions-none").wait_for()
        assert "flowtide subscription add" in page.get_by_test_id("subscriptions-none").inner_text()
        shot(page, "local-subscriptions-none")
