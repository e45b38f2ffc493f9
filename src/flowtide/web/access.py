"""Who may call what: authentication and authorisation of every request, in one place.

1. `Gate`, an ASGI middleware around the whole app, authenticates every request but
   those of `PUBLIC_PATHS` (`/healthz`, `/readyz`, the OpenAPI document and its pages,
   the web UI's page and assets, signing in to it, a webhook's delivery, which its
   signature authenticates (`PUBLIC_REQUESTS`), and `/metrics` when the server is told
   so): a bearer flowtide token (`flowtide.auth.tokens`) or a JWT of the
   organisation's identity provider (`flowtide.auth.oidc`), or, from a browser signed in
   to the UI, the id of its session in its cookie (`flowtide.auth.sessions`, never a
   token: a token in the cookie is refused; a cookie alone may change nothing without the
   `X-Flowtide-CSRF: 1` header). No credential, or one that does not verify: 401, before
   the body is read. It also caps every request body,
   public ones included (413).
2. `RULES` says which roles may call each route, and `authorize`, a dependency of every
   route of the app, enforces it (403 otherwise). A route without a rule is refused, so
   a new endpoint cannot be open by mistake (a test walks the app's routes).
3. What a rule cannot say alone, the route checks with the caller (`caller`): a worker
   reports, claims and heartbeats only as a worker id its own credential registered
   (`flowtide.server.worker_registry`), and reads or starts executions only through the
   commands it holds.

Roles: `reader` < `operator` < `admin` (each may do what the one before may); `worker`
is apart. A server started with --insecure-no-auth lets everyone do everything, and
says so in its log.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final

from fastapi import Depends, Request
from fastapi.exceptions import HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flowtide.auth.oidc import jwt_expiry, looks_like_jwt
from flowtide.auth.principal import ANONYMOUS, Principal, outranks
from flowtide.auth.sessions import Sessions
from flowtide.errors import AuthError

if TYPE_CHECKING:
    from flowtide.auth.oidc import JwtVerifier
    from flowtide.auth.tokens import TokenStore

__all__ = [
    "CSRF_HEADER",
    "PUBLIC_PATHS",
    "PUBLIC_PREFIXES",
    "PUBLIC_REQUESTS",
    "RULES",
    "SESSION_COOKIE",
    "Authenticator",
    "Gate",
    "Rule",
    "authorize",
    "authorizer",
    "caller",
    "cookie_token",
]

log = logging.getLogger("flowtide.web.access")

#: Where a request's principal is kept in the ASGI scope.
PRINCIPAL: Final = "flowtide.principal"
#: Default cap of a request body (`flowtide server --max-body`).
DEFAULT_MAX_BODY: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class Rule:
    """The roles that may call a route: any of `roles`, where a person's role also
    admits the more powerful ones. `public`: no credential needed."""

    roles: tuple[str, ...] = ()
    public: bool = False

    def admits(self, principal: Principal) -> bool:
        return self.public or any(principal.can(role) for role in self.roles)

    def admits_role(self, role: str) -> bool:
        return self.public or any(outranks(role, needed) for needed in self.roles)


PUBLIC: Final = Rule(public=True)
READER: Final = Rule(("reader",))
OPERATOR: Final = Rule(("operator",))
ADMIN: Final = Rule(("admin",))
WORKER: Final = Rule(("worker",))
#: People with the role, or a worker for what its commands need (the route checks which).
READER_OR_WORKER: Final = Rule(("reader", "worker"))
OPERATOR_OR_WORKER: Final = Rule(("operator", "worker"))

#: (method, route path as declared) -> rule. HEAD follows GET.
RULES: Final[dict[tuple[str, str], Rule]] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    # the web UI (flowtide.ui.pages, flowtide.web.session): the page and its assets, signing in and out
    ("GET", "/"): PUBLIC,
    ("GET", "/ui"): PUBLIC,
    ("GET", "/ui/{path:path}"): PUBLIC,
    ("POST", "/api/session"): PUBLIC,
    ("DELETE", "/api/session"): PUBLIC,
    # Public only when the server is started with --public-metrics (see Gate).
    ("GET", "/metrics"): READER,
    # executions
    ("POST", "/api/execute"): OPERATOR_OR_WORKER,  # a worker: sub-playbooks of its commands
    ("GET", "/api/executions"): READER,
    ("GET", "/api/executions/{execution_id}"): READER_OR_WORKER,
    ("GET", "/api/executions/{execution_id}/status"): READER_OR_WORKER,
    ("POST", "/api/executions/{execution_id}/cancel"): OPERATOR,
    ("GET", "/api/executions/{execution_id}/cancellation-check"): READER_OR_WORKER,
    ("GET", "/api/executions/{execution_id}/events"): READER,
    ("GET", "/api/executions/{execution_id}/summary"): READER,
    ("GET", "/api/executions/{execution_id}/timeline"): READER,
    ("GET", "/api/executions/{execution_id}/steps/{step}"): READER,
    ("POST", "/api/executions/{execution_id}/rerun"): OPERATOR,
    ("GET", "/api/executions/{execution_id}/events/stream"): READER,
    ("GET", "/api/executions/{execution_id}/logs"): READER,
    ("POST", "/api/executions/{execution_id}/finalize"): ADMIN,
    ("GET", "/api/commands/{event_id:int}"): READER,
    # A sub-playbook's result intact (not masked), for the worker waiting on it: never
    # for people, who read the masked document.
    ("GET", "/api/internal/executions/{execution_id}/result"): WORKER,
    # variables
    ("GET", "/api/vars/{execution_id}"): READER,
    ("POST", "/api/vars/{execution_id}"): OPERATOR,
    ("DELETE", "/api/vars/{execution_id}"): OPERATOR,
    ("GET", "/api/vars/{execution_id}/{name}"): READER,
    ("PUT", "/api/vars/{execution_id}/{name}"): OPERATOR,
    ("DELETE", "/api/vars/{execution_id}/{name}"): OPERATOR,
    # workers: their own identity only (checked by the routes)
    ("POST", "/api/events"): WORKER,
    ("POST", "/api/events/batch"): WORKER,
    ("POST", "/api/events/reports"): WORKER,
    ("POST", "/api/commands/{event_id:int}/claim"): WORKER,
    ("POST", "/api/commands/claim"): WORKER,
    ("POST", "/api/worker/pool/register"): WORKER,
    ("POST", "/api/worker/pool/heartbeat"): WORKER,
    ("POST", "/api/worker/pool/deregister"): WORKER,
    ("POST", "/api/worker/commands/release"): WORKER,
    ("POST", "/api/worker/credentials"): WORKER,
    ("GET", "/api/worker/pools"): ADMIN,
    # outbox, for external relays and autoscalers
    ("GET", "/api/internal/shards/topology"): READER_OR_WORKER,
    ("GET", "/api/internal/outbox/pending-count"): ADMIN,
    ("POST", "/api/internal/outbox/claim"): ADMIN,
    ("POST", "/api/internal/outbox/mark-published"): ADMIN,
    ("POST", "/api/internal/outbox/mark-failed"): ADMIN,
    # schedules (flowtide.web.schedules)
    ("GET", "/api/schedules"): READER,
    ("POST", "/api/schedules"): OPERATOR,
    ("GET", "/api/schedules/{name}"): READER,
    ("DELETE", "/api/schedules/{name}"): OPERATOR,
    ("POST", "/api/schedules/{name}/pause"): OPERATOR,
    ("POST", "/api/schedules/{name}/resume"): OPERATOR,
    ("POST", "/api/schedules/{name}/trigger"): OPERATOR,
    ("POST", "/api/schedules/{name}/backfill"): OPERATOR,
    # catalog
    ("POST", "/api/catalog/register"): OPERATOR,
    ("GET", "/api/catalog/list"): READER,
    ("POST", "/api/catalog/validate"): READER,
    ("GET", "/api/catalog/{path:path}"): READER,
    # subscriptions (flowtide.web.subscriptions)
    ("GET", "/api/subscriptions"): READER,
    ("POST", "/api/subscriptions"): OPERATOR,
    ("GET", "/api/subscriptions/{name}"): READER,
    ("DELETE", "/api/subscriptions/{name}"): OPERATOR,
    ("POST", "/api/subscriptions/{name}/pause"): OPERATOR,
    ("POST", "/api/subscriptions/{name}/resume"): OPERATOR,
    # webhooks (flowtide.web.hooks): a delivery is public, checked by its signature
    ("GET", "/api/hooks"): READER,
    ("POST", "/api/hooks"): OPERATOR,
    ("GET", "/api/hooks/{name}"): READER,
    ("DELETE", "/api/hooks/{name}"): OPERATOR,
    ("POST", "/api/hooks/{name}"): PUBLIC,
    # secrets and who may get in
    ("POST", "/api/credentials"): ADMIN,
    ("GET", "/api/credentials"): ADMIN,
    ("GET", "/api/credentials/{name}"): ADMIN,
    ("DELETE", "/api/credentials/{name}"): ADMIN,
    ("GET", "/api/keychain"): ADMIN,
    ("POST", "/api/keychain/{catalog_id:path}/{name}"): ADMIN,
    ("GET", "/api/keychain/{catalog_id:path}/{name}"): ADMIN,
    ("DELETE", "/api/keychain/{catalog_id:path}/{name}"): ADMIN,
    ("POST", "/api/tokens"): ADMIN,
    ("GET", "/api/tokens"): ADMIN,
    ("DELETE", "/api/tokens/{token}"): ADMIN,
    ("GET", "/api/whoami"): Rule(("reader", "worker")),
}

#: Paths served without a credential: the probes of orchestrators and load balancers,
#: and the API's description (flowtide's API is public; its data is not). The docs page
#: takes a token with its Authorize button.
PUBLIC_PATHS: Final = frozenset(
    {
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        # The web UI's page and assets (no data in them), and its sign-in.
        "/",
        "/ui",
        "/api/session",
    }
)
#: Paths public by their prefix: the UI's page routes and assets.
PUBLIC_PREFIXES: Final = ("/ui/",)
#: Requests public by method and path: a webhook's delivery, which its signature
#: authenticates (`flowtide.web.hooks`), not a token.
PUBLIC_REQUESTS: Final = (("POST", re.compile(r"/api/hooks/[^/]+")),)
#: The cookie that carries a signed-in browser's session id (`flowtide.web.session`).
SESSION_COOKIE: Final = "flowtide_session"
#: The header a cookie-authenticated request that changes something must carry: no
#: other site's page can make a browser send it (the API allows no CORS).
CSRF_HEADER: Final = "x-flowtide-csrf"
#: Methods that change nothing (a cookie alone may call them).
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def cookie_token(header: bytes | None) -> str | None:
    """The session cookie's value (a session id) in a raw Cookie header, if any."""
    if not header:
        return None
    for part in header.decode("latin-1").split(";"):
        name, _, value = part.strip().partition("=")
        if name == SESSION_COOKIE and value:
            return value.strip('"')
    return None


def principal_of(request: Request) -> Principal:
    """The request's principal, as the Gate authenticated it."""
    principal = request.scope.get(PRINCIPAL)
    if principal is None:  # only a public route gets here without one
        raise AuthError("authentication required", status=401)
    return principal  # type: ignore[no-any-return]


async def caller(request: Request) -> Principal:
    """The request's principal (a dependency for routes that scope what they do by it).
    A coroutine, though it never waits: FastAPI runs a plain function dependency in its
    thread pool, a thread hop on every request that names its caller (worker reports
    included)."""
    return principal_of(request)


_BEARER: Final = HTTPBearer(
    auto_error=False,
    description="A flowtide API token (`flowtide token create`) or a JWT of the server's "
    "identity provider.",
)


def authorizer(rules: Mapping[tuple[str, str], Rule]) -> Callable[..., Awaitable[None]]:
    """An app-wide dependency that admits a caller when the route's rule in `rules`
    does (else 401/403), and refuses every route without a rule."""

    async def authorize(
        request: Request,
        # Only declares the scheme in the OpenAPI document (the docs' Authorize button):
        # the Gate has authenticated the request already.
        _: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)] = None,
    ) -> None:
        route = request.scope.get("route")
        method = "GET" if request.method == "HEAD" else request.method
        path = getattr(route, "path", request.url.path)
        rule = rules.get((method, path))
        if rule is None:
            # Fail closed: an endpoint nobody wrote a rule for is nobody's.
            log.error("no access rule for %s %s: refused", method, path)
            raise AuthError(f"{method} {path} has no access rule", status=403)
        if rule.public or (path == "/metrics" and request.scope.get(PRINCIPAL) is ANONYMOUS):
            return
        principal = principal_of(request)
        if not rule.admits(principal):
            needed = " or ".join(rule.roles)
            raise AuthError(
                f"{principal.describe()} may not {method} {path} (needs {needed})", status=403
            )

    return authorize


#: The server's app-wide dependency: the route's rule in `RULES` admits the caller.
authorize = authorizer(RULES)


class Authenticator:
    """Turns a request's `Authorization` header, or a browser's session cookie, into a
    principal; opens and ends the browsers' sessions (`flowtide.auth.sessions`, kept in
    `sessions`: in memory unless given a store).

    Verified tokens are cached for `ttl` seconds per server process (a revoked token
    stops working within that time); failures for a second, so a flood of bad tokens
    does not become a flood of queries.
    """

    def __init__(
        self,
        tokens: TokenStore | None,
        jwt: JwtVerifier | None = None,
        *,
        insecure: bool = False,
        ttl: float = 5.0,
        max_entries: int = 10_000,
        sessions: Sessions | None = None,
    ) -> None:
        self.tokens = tokens
        self.jwt = jwt
        self.insecure = insecure
        self.ttl = ttl
        self.max_entries = max_entries
        self.sessions = sessions if sessions is not None else Sessions()
        self._cache: OrderedDict[bytes, tuple[float, Principal | AuthError]] = OrderedDict()

    async def open_session(self, principal: Principal, token: str) -> tuple[str, float]:
        """A new session for `principal`, who `token` verified as: its id (for the
        cookie, never stored) and its lifetime in seconds (a JWT's expiry caps it).

        Raises:
            AuthError: 403 for a worker (workers have no business in the UI).
        """
        if principal.role == "worker":
            raise AuthError("a worker's token cannot sign in to the web UI", status=403)
        if looks_like_jwt(token):
            return await self.sessions.open(principal, None, jwt_expiry(token))
        # A token's principal is named by the token's id: revoking it ends the session.
        token_id = principal.subject if self.tokens is not None and not principal.insecure else None
        return await self.sessions.open(principal, token_id)

    async def resume(self, session_id: str) -> Principal:
        """The principal of a browser's live session (AuthError 401 otherwise)."""
        if self.insecure:
            return ANONYMOUS
        return await self.sessions.resume(session_id)

    async def authenticate(self, header: str | None) -> Principal:
        """The principal of `Authorization: Bearer <token>`.

        Raises:
            AuthError: 401 (none, malformed, invalid, expired, revoked) or 403 (a JWT
                whose claims map to no role).
        """
        if self.insecure:
            return ANONYMOUS
        if not header:
            raise AuthError(
                "authentication required: send Authorization: Bearer <token>", status=401
            )
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 16_384:
            raise AuthError("the Authorization header must be 'Bearer <token>'", status=401)
        key = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            found = hit[1]
        else:
            found = await self._verify(token)
            ttl = self.ttl if isinstance(found, Principal) else 1.0
            self._cache[key] = (now + ttl, found)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        if isinstance(found, AuthError):
            raise found
        return found

    async def _verify(self, token: str) -> Principal | AuthError:
        try:
            if looks_like_jwt(token):
                if self.jwt is None:
                    return AuthError("invalid or expired token", status=401)
                return await asyncio.to_thread(self.jwt.verify, token)
            if self.tokens is None:
                return AuthError("invalid or expired token", status=401)
            tokens = self.tokens
            # last_used is written at most once a minute per token.
            record = await asyncio.to_thread(
                lambda: tokens.verify(token, touch_before=time.time() - 60)
            )
        except AuthError as exc:
            return exc
        return Principal(record.token_id, record.name, record.role, record.pool)


def error_body(status: int, message: str, **extra: Any) -> bytes:
    return json.dumps({"error": {"status": status, "message": message, **extra}}).encode()


class BodyTooLarge(HTTPException):
    """A body that grew past the cap while it was read (a chunked upload)."""


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Gate:
    """ASGI middleware: authenticate (401), cap the body (413), then the app.

    `authenticator` is read per request (it exists once the app has started).
    """

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        authenticator: Callable[[], Authenticator | None],
        max_body: int = DEFAULT_MAX_BODY,
        public_metrics: bool = False,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.max_body = max_body
        self.public = PUBLIC_PATHS | ({"/metrics"} if public_metrics else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if (
            scope["path"] in self.public
            or scope["path"].startswith(PUBLIC_PREFIXES)
            or any(
                scope["method"] == method and pattern.fullmatch(scope["path"])
                for method, pattern in PUBLIC_REQUESTS
            )
        ):
            if scope["path"] == "/metrics":
                scope[PRINCIPAL] = ANONYMOUS
            # Public, but a body is capped all the same (signing in takes one).
            if await self._length_refused(headers, send):
                return
            await self.app(scope, self._capped(receive), send)
            return
        auth = self.authenticator()
        if auth is None:  # not started (or stopping): nobody can be checked
            await _reply(send, 503, "server is starting", {})
            return
        header = headers.get(b"authorization")
        session_id = None
        if header is None and (session_id := cookie_token(headers.get(b"cookie"))) is not None:
            # A browser signed in to the UI. What changes something must say it comes
            # from the UI's own page (CSRF).
            if scope["method"] not in _SAFE_METHODS and headers.get(CSRF_HEADER.encode()) != b"1":
                await _reply(
                    send,
                    403,
                    f"a request signed in by cookie must send {CSRF_HEADER}: 1"
                    " (cross-site requests are refused)",
                    {},
                )
                return
        try:
            if session_id is not None:
                principal = await auth.resume(session_id)
            else:
                principal = await auth.authenticate(header.decode("latin-1") if header else None)
        except AuthError as exc:
            extra = {b"www-authenticate": b'Bearer realm="flowtide"'} if exc.status == 401 else {}
            await _reply(send, exc.status, exc.message, extra)
            return
        scope[PRINCIPAL] = principal
        if await self._length_refused(headers, send):
            return
        await self.app(scope, self._capped(receive), send)

    async def _length_refused(self, headers: dict[bytes, bytes], send: Send) -> bool:
        """Answer 400 or 413 for a Content-Length that is not a number or over the cap."""
        length = headers.get(b"content-length")
        if length is None:
            return False
        try:
            size = int(length)
        except ValueError:
            await _reply(send, 400, "Content-Length is not a number", {})
            return True
        if size > self.max_body:
            await _reply(send, 413, self._too_large(), {})
            return True
        return False

    def _too_large(self) -> str:
        return f"request body larger than {self.max_body} bytes (the server's --max-body)"

    def _capped(self, receive: Receive) -> Receive:
        seen = 0
        limit = self.max_body
        message = self._too_large()

        async def capped() -> MutableMapping[str, Any]:
            nonlocal seen
            event = await receive()
            if event["type"] == "http.request":
                seen += len(event.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(413, message)
            return event

        return capped


async def _reply(send: Send, status: int, message: str, extra: dict[bytes, bytes]) -> None:
    body = error_body(status, message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra.items(),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
