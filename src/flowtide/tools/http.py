"""The `http` tool: one HTTP request through a process-wide pooled httpx client.

Result (NoETL's shape, so `{{ step.data }}`, `response.get('body')` and
`http_result.get('headers')['content-length']` all work)::

    {"status_code": 200, "headers": {...lower-case...}, "data": <JSON or text>,
     "body": <same as data>, "url": "...", "elapsed": 0.012}

A response with status >= 400 raises ToolError whose `data` is that same dict, with the kind
NoETL policies test: rate_limit (429), server_error (5xx), auth (401/403), not_found (404),
client_error (other 4xx); transport failures are timeout or connection. A response body
over `max_response_bytes` (default FLOWTIDE_HTTP_MAX_RESPONSE_BYTES, 256 MiB) is not read
further: the task fails with kind `response_too_large`, before it can fill the memory.

httpx is imported lazily: start-up time matters and most playbooks never make a request.
"""

from __future__ import annotations

import atexit
import base64
import email.utils
import json
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import loads
from flowtide.tools.base import ToolContext, redact

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpTool", "close_clients"]

DEFAULT_TIMEOUT = 30.0
#: Largest response body read (bytes, as received); `max_response_bytes` on a task.
# Sized for a parallel loop of ~64 in-flight requests; beyond that, requests wait for a free
# connection (bounded by the request's own timeout) instead of opening sockets without limit.
MAX_CONNECTIONS = 100
MAX_KEEPALIVE = 64
USER_AGENT = "flowtide/0.1"

_FALSE_WORDS = frozenset({"false", "0", "no", "off", "n", ""})
_BODY_KEYS = ("json", "payload", "body")
# For these methods a mapping given as `payload`/`data` becomes query parameters, as NoETL's
# http tool does; a body on a GET is ignored by most servers.
_QUERY_METHODS = frozenset({"GET", "HEAD"})

_clients: dict[bool | str, httpx.Client] = {}
_clients_lock = threading.Lock()
_atexit_registered = False


def close_clients() -> None:
    """Close the shared httpx clients (called at exit; tests call it too)."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        try:
            client.close()
        except Exception:  # closing at exit must never raise
            pass


def warm_up() -> None:
    """Create the default shared client now (TLS context and all: a few hundred ms on a
    slow machine) instead of inside the first request a long-lived worker runs."""
    _shared_client(True)


def _shared_client(verify: bool | str) -> httpx.Client:
    """The process-wide client for one TLS-verification setting (httpx.Client is thread-safe)."""
    global _atexit_registered
    import httpx

    with _clients_lock:
        client = _clients.get(verify)
        if client is None or client.is_closed:
            client = httpx.Client(
                verify=verify,
                limits=httpx.Limits(
                    max_connections=MAX_CONNECTIONS,
                    max_keepalive_connections=MAX_KEEPALIVE,
                    keepalive_expiry=30.0,
                ),
                timeout=DEFAULT_TIMEOUT,
                headers={"user-agent": USER_AGENT},
            )
            _clients[verify] = client
            if not _atexit_registered:
                atexit.register(close_clients)
                _atexit_registered = True
        return client


def _as_bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_WORDS
    return bool(value)


def _verify_setting(value: Any) -> bool | str:
    # A string that is not a boolean word is a CA bundle path.
    if isinstance(value, str) and value.strip().lower() not in _FALSE_WORDS | {"true", "1", "yes"}:
        return value
    return _as_bool(value, True)


def _timeout(config: Mapping[str, Any], ctx: ToolContext) -> float:
    raw = config.get("timeout")
    if raw in (None, ""):
        raw = config.get("timeout_seconds")
    if raw in (None, ""):
        return float(ctx.timeout) if ctx.timeout else DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ToolError(
            f"http `timeout` must be a number of seconds, not {raw!r}", kind="config_error"
        ) from None
    if value <= 0:
        raise ToolError("http `timeout` must be positive", kind="config_error")
    return value


def _clean_mapping(value: Any, field: str) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if not isinstance(value, Mapping):
        raise ToolError(
            f"http `{field}` must be a mapping, not {type(value).__name__}", kind="config_error"
        )
    # A templated optional parameter renders to None; sending "name=" would change meaning.
    return {str(k): v for k, v in value.items() if v is not None}


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(value)
    return value


# ---------------------------------------------------------------------------------------
# Auth
# ---------------------------------------------------------------------------------------


def _resolve_alias(alias: str, ctx: ToolContext) -> dict[str, Any]:
    return ctx.resolve_credential(alias)


def _auth_headers(auth: Any, ctx: ToolContext) -> dict[str, str]:
    """Headers that authenticate the request; every secret value goes to ctx.add_secret."""
    if auth in (None, ""):
        return {}
    label = "inline auth"
    if isinstance(auth, str):
        label = f"credential '{auth}'"
        body = _resolve_alias(auth.strip(), ctx)
    elif isinstance(auth, Mapping):
        body = dict(auth)
        alias = body.get("credential") or body.get("alias") or body.get("key")
        if isinstance(alias, str) and alias and not ({"token", "password", "headers"} & set(body)):
            label = f"credential '{alias}'"
            body = _resolve_alias(alias, ctx)
    else:
        raise ToolError("http `auth` must be a credential alias or a mapping", kind="config_error")

    kind = str(body.get("type") or "").strip().lower()
    headers: dict[str, str] = {}
    extra = body.get("headers")
    if isinstance(extra, Mapping):
        for name, value in extra.items():
            ctx.add_secret(str(value))
            headers[str(name)] = str(value)

    token = body.get("token") or body.get("access_token")
    username = body.get("username", body.get("user"))
    password = body.get("password")
    if token and kind in ("", "bearer", "token", "oauth2"):
        ctx.add_secret(str(token))
        headers["Authorization"] = f"Bearer {token}"
    elif username is not None and password is not None and kind in ("", "basic"):
        ctx.add_secret(str(password))
        encoded = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        ctx.add_secret(encoded)
        headers["Authorization"] = f"Basic {encoded}"
    elif kind in ("api_key", "apikey", "header") and body.get("value") is not None:
        ctx.add_secret(str(body["value"]))
        headers[str(body.get("header") or body.get("name") or "X-API-Key")] = str(body["value"])

    if not headers:
        raise ToolError(
            f"{label} has no usable auth fields: expected {{type: bearer, token}}, "
            "{username, password} or {headers: {...}}",
            kind="credential",
        )
    return headers


# ---------------------------------------------------------------------------------------
# Request and response
# ---------------------------------------------------------------------------------------


def _body_arguments(
    config: Mapping[str, Any], method: str, headers: httpx.Headers, params: dict[str, Any]
) -> dict[str, Any]:
    """httpx keyword arguments for the request body (json/content/data)."""
    for key in _BODY_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if key == "payload" and method in _QUERY_METHODS and isinstance(value, Mapping):
            for name, item in value.items():
                params.setdefault(str(name), item)
            return {}
        if isinstance(value, bytes):
            return {"content": value}
        if isinstance(value, str):
            return {"content": value.encode()}
        return {"json": value}

    form_key = "form" if config.get("form") is not None else "data"
    form = config.get(form_key)
    if form is None:
        return {}
    if isinstance(form, Mapping):
        if form_key == "data" and method in _QUERY_METHODS:
            for name, item in form.items():
                params.setdefault(str(name), item)
            return {}
        # `data:` with an explicit JSON content type is a JSON body (auth0 callbacks do this).
        if form_key == "data" and "json" in headers.get("content-type", "").lower():
            return {"json": dict(form)}
        return {"data": {str(k): _form_value(v) for k, v in form.items() if v is not None}}
    if isinstance(form, bytes):
        return {"content": form}
    if isinstance(form, str):
        return {"content": form.encode()}
    return {"json": form}


def _form_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(value)
    if isinstance(value, list):
        return [_form_value(v) for v in value]
    return value


def _response_headers(response: httpx.Response) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def _read_body(response: httpx.Response, limit: int, what: str) -> str:
    """The body of a streamed `response` as text, read no further than `limit` bytes.

    Raises:
        ToolError: kind response_too_large.
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(what, f"its Content-Length is {int(declared)} bytes", limit)
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise _too_large(what, "its body goes on", limit)
        chunks.append(chunk)
    encoding = response.encoding or "utf-8"
    return b"".join(chunks).decode(encoding, errors="replace")


def _too_large(what: str, why: str, limit: int) -> ToolError:
    return ToolError(
        f"{what}: the response is too large: {why} past the {limit}-byte limit"
        " (`max_response_bytes`, FLOWTIDE_HTTP_MAX_RESPONSE_BYTES); nothing more was read",
        kind="response_too_large",
        code="RESPONSE_TOO_LARGE",
    )


def _response_data(response: httpx.Response, text: str) -> Any:
    content_type = response.headers.get("content-type", "").lower()
    if "json" in content_type:
        if not text.strip():
            return None
        try:
            # NaN and Infinity, which some servers send, become null (jsonvalues' rule).
            return loads(text)
        except ValueError:
            return text  # the server lied about the content type; keep what it sent
    return text


def _max_response_bytes(config: Mapping[str, Any]) -> int:
    raw = config.get("max_response_bytes")
    if raw in (None, ""):
        from flowtide.settings import LimitsSection, current

        return current(LimitsSection).http_max_response_bytes
    try:
        limit = int(raw)
    except (TypeError, ValueError):
        limit = 0
    if limit <= 0:
        raise ToolError(
            f"`max_response_bytes` must be a positive number of bytes, not {raw!r}",
            kind="config_error",
        )
    return limit


def _retry_after(value: str | None) -> float | int | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        return max(0.0, round(float(value), 3))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, round(when.timestamp() - time.time(), 3))


def _without_password(url: str) -> tuple[str, str | None]:
    """`url` with the password of its user part as `***`, and that password."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url, None
    if not password:
        return url, None
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}")), password


def _status_kind(status: int) -> tuple[str, bool]:
    if status == 429:
        return "rate_limit", True
    if status >= 500:
        return "server_error", True
    if status in (401, 403):
        return "auth", False
    if status == 404:
        return "not_found", False
    return "client_error", False


def _snippet(data: Any, limit: int = 200) -> str:
    text = data if isinstance(data, str) else json.dumps(data, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HttpTool:
    """Make one HTTP request (tool kind `http`)."""

    kind = "http"

    def warm(self) -> None:
        """Import httpx and open the shared client before the first request, so the
        first requests of a parallel loop go out in the order they were issued instead
        of piling up behind the import."""
        _shared_client(True)

    def run(self, config: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Send the request described by `config` and return the response as a dict.

        Config: `method` (GET), `url` | `endpoint`, `params`, `headers`, body as
        `json` | `payload` | `body` (mapping/list → JSON, str → raw) or `data` | `form`
        (mapping → form-encoded), `timeout` | `timeout_seconds` (30 s), `verify_ssl`,
        `follow_redirects` (true), `auth` (credential alias or inline mapping).
        Raises ToolError (see the module docstring for kinds).
        """
        import httpx

        url = config.get("url") or config.get("endpoint")
        if not url or not isinstance(url, str):
            raise ToolError("http task needs a `url` (or `endpoint`)", kind="config_error")
        method = str(config.get("method") or "GET").strip().upper()
        # What error messages say of the request: never a password written in the URL
        # (`https://user:pass@host/`), which no secret set may hold.
        shown, password = _without_password(url)
        hidden = ctx.secrets | {password} if password else ctx.secrets
        params = {
            k: _query_value(v) for k, v in _clean_mapping(config.get("params"), "params").items()
        }
        headers = httpx.Headers(
            {k: str(v) for k, v in _clean_mapping(config.get("headers"), "headers").items()}
        )
        body = _body_arguments(config, method, headers, params)
        # Auth goes last: an explicit credential beats a stray Authorization header.
        headers.update(_auth_headers(config.get("auth"), ctx))
        timeout = _timeout(config, ctx)
        client = _shared_client(_verify_setting(config.get("verify_ssl", config.get("verify"))))

        limit = _max_response_bytes(config)
        try:
            request = client.build_request(
                method, url, params=params or None, headers=headers, timeout=timeout, **body
            )
            response = client.send(
                request,
                stream=True,
                follow_redirects=_as_bool(config.get("follow_redirects"), True),
            )
            try:
                text = _read_body(response, limit, f"{method} {shown}")
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            raise ToolError(
                f"{method} {shown} timed out after {timeout:g} s ({type(exc).__name__})",
                kind="timeout",
                retryable=True,
                code="TIMEOUT",
            ) from None
        except httpx.ConnectError as exc:
            raise ToolError(
                f"{method} {shown}: cannot connect: {redact(str(exc), hidden)}",
                kind="connection",
                retryable=True,
                code="CONNECTION_ERROR",
            ) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as exc:
            raise ToolError(
                f"{method} {shown}: invalid request: {redact(str(exc), hidden)}",
                kind="client_error",
                code="INVALID_REQUEST",
            ) from None
        except httpx.TooManyRedirects as exc:
            raise ToolError(
                f"{method} {shown}: {redact(str(exc), hidden)}",
                kind="client_error",
                code="TOO_MANY_REDIRECTS",
            ) from None
        except httpx.HTTPError as exc:
            # Dropped connections, protocol errors mid-response: worth another attempt.
            raise ToolError(
                f"{method} {shown}: {type(exc).__name__}: {redact(str(exc), hidden)}",
                kind="connection",
                retryable=True,
                code="CONNECTION_ERROR",
            ) from None
        except (TypeError, ValueError) as exc:
            # e.g. a JSON body holding values json cannot encode, or a non-ASCII header.
            raise ToolError(
                f"{method} {shown}: cannot build request: {redact(str(exc), hidden)}",
                kind="config_error",
            ) from None

        data = _response_data(response, text)
        result: dict[str, Any] = {
            "status_code": response.status_code,
            "headers": _response_headers(response),
            "data": data,
            "body": data,
            "url": str(response.url),
            "elapsed": response.elapsed.total_seconds(),
        }
        status = response.status_code
        if status < 400:
            return result

        kind, retryable = _status_kind(status)
        message = f"HTTP {status} {response.reason_phrase} from {method} {shown}"
        retry_after = _retry_after(result["headers"].get("retry-after"))
        if retry_after is not None:
            result["retry_after"] = retry_after
            message += f" (retry after {retry_after} s)"
        if data not in (None, ""):
            message += f": {_snippet(data)}"
        raise ToolError(
            message,
            kind=kind,
            retryable=retryable,
            code=f"HTTP_{status}",
            http_status=status,
            data=result,
        )
