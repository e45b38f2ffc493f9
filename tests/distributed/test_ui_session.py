"""The web UI's page, assets and browser session on a real server: the page is public
and carries a strict CSP; a browser signs in with a token and is then known by an
HttpOnly cookie; a cookie alone cannot change anything without the CSRF header; nothing
outside the shipped assets is served."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import httpx

from .stack import Stack


@contextlib.contextmanager
def _session(stack: Stack, role: str) -> Iterator[httpx.Client]:
    """A browser-like client signed in as `role` (the cookie only, no bearer header)."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        r = client.post("/api/session", json={"token": stack.tokens[role]})
        assert r.status_code == 200, r.text
        assert r.json()["role"] == role
        yield client


def test_signing_in_sets_an_httponly_strict_cookie_the_api_takes(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as anon:
        r = anon.post("/api/session", json={"token": "ft_not-a-token"})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert anon.get("/api/whoami").status_code == 401
    with _session(stack, "reader") as browser:
        cookie = browser.post("/api/session", json={"token": stack.tokens["reader"]}).headers[
            "set-cookie"
        ]
        flags = {p.strip().split("=")[0].lower() for p in cookie.split(";")}
        assert {"httponly", "path", "max-age", "samesite"} <= flags
        assert "samesite=strict" in cookie.lower()
        assert "secure" not in flags  # plain HTTP here: a Secure cookie would not come back
        me = browser.get("/api/whoami")
        assert me.status_code == 200 and me.json()["role"] == "reader"
        assert browser.get("/api/executions").status_code == 200
        # The role still decides: a reader may not cancel, cookie or not.
        r = browser.post(
            "/api/executions/123/cancel", json={"reason": "x"}, headers={"x-flowtide-csrf": "1"}
        )
        assert r.status_code == 403 and "needs operator" in r.json()["error"]["message"]
        # Signing out clears the cookie.
        out = browser.delete("/api/session")
        assert out.status_code == 200 and "max-age=0" in out.headers["set-cookie"].lower()
        assert browser.get("/api/whoami").status_code == 401


def test_a_cookie_alone_cannot_change_anything_without_the_csrf_header(stack: Stack) -> None:
    with _session(stack, "operator") as browser:
        missing = "/api/executions/123/cancel"
        r = browser.post(missing, json={"reason": "forged"})
        assert r.status_code == 403 and "x-flowtide-csrf" in r.json()["error"]["message"]
        r = browser.post(missing, json={"reason": "ui"}, headers={"x-flowtide-csrf": "1"})
        assert r.status_code == 404  # past the gate and the rule: no such execution
    # A bearer token needs no such header (no browser sends it on its own).
    with stack.client("operator") as api:
        r = api.post("/api/executions/123/cancel", json={"reason": "cli"})
        assert r.status_code == 404
    # A cookie with a bad token is refused as a bad bearer token is.
    with httpx.Client(base_url=stack.url, timeout=30) as forged:
        forged.cookies.set("flowtide_session", "ft_forged")
        assert forged.get("/api/whoami").status_code == 401


def test_the_page_and_its_assets_are_public_and_nothing_else_is_served(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30) as anon:
        root = anon.get("/")
        assert root.status_code == 307 and root.headers["location"] == "/ui"
        for path in ("/ui", "/ui/executions/7311", "/ui/executions?status=failed"):
            page = anon.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"].startswith("text/html")
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert page.headers["x-content-type-options"] == "nosniff"
            assert "/ui/static/app.js" in page.text
        js = anon.get("/ui/static/app.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        for bad in (
            "/ui/static/../graph.py",
            "/ui/static/%2e%2e/graph.py",
            "/ui/static/..%2Fsummary.py",
            "/ui/static/%2e%2e%2f%2e%2e%2fserver/ui.py",
            "/ui/static/missing.js",
            "/ui/static/",
        ):
            r = anon.get(bad)
            # Never a file outside the shipped assets: a 404, or the page itself for a
            # path the client normalised to one outside /ui/static/.
            assert "def " not in r.text and "import" not in r.text, bad
            if r.status_code == 200:
                assert r.headers["content-type"].startswith("text/html"), bad
                assert "/ui/static/app.js" in r.text
            else:
                assert r.status_code == 404, bad
        assert anon.get("/ui/static/missing.js").status_code == 404
    # Public, but the body cap holds: refused on its declared length, before the body.
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            b"POST /api/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 67108864\r\n\r\n{}"
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 413")
