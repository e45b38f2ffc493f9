"""Webhooks: a hook's stored form, its secret sealed at rest, and what a delivery is
checked against (its signature, its timestamp's window, its rate) and turned into (a
workload). The HTTP side, shared by the server and the embedded apps, is
`flowtide.web.hooks`; the CLI's is `flowtide.cli.hooks`.

A hook is a trigger of kind `hook` (`flowtide.store.triggers`): its spec is
`{"playbook": <ref>, "workload": <template or null>, "rate": <per second or null>}`;
its secret is kept beside it as a Fernet token of the master key (as credentials are),
never in the spec, never shown. A delivery is signed
`X-Flowtide-Signature: sha256=<hex HMAC-SHA256(secret, body)>` (GitHub's
`X-Hub-Signature-256` too); with `X-Flowtide-Timestamp: <unix seconds>` the signature
covers `<timestamp>.<body>` and the timestamp must be inside the replay window.

Pure but for `add_hook` and `hook_secret` (the store, blocking: run them in a thread).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs

from flowtide.errors import NotFoundError, TriggerError

if TYPE_CHECKING:
    from flowtide.sealing import Sealer
    from flowtide.store.base import Store
    from flowtide.store.triggers import TriggerRow

__all__ = [
    "DELIVERY_HEADERS",
    "HOOK",
    "MAX_SECRET_BYTES",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "RateLimits",
    "Refusals",
    "add_hook",
    "check_name",
    "check_secret",
    "credential_secret",
    "decode_body",
    "delivery_id",
    "delivery_workload",
    "hook_secret",
    "parse_rate",
    "rate_text",
    "shown_headers",
    "sign",
    "store_sealer",
    "verify",
]

#: The trigger kind of a webhook.
HOOK: Final = "hook"
#: The largest secret a hook keeps (a secret file over it is refused).
MAX_SECRET_BYTES: Final = 4096
SIGNATURE_HEADER: Final = "X-Flowtide-Signature"
#: The signature headers a delivery may carry (flowtide's, GitHub's), lower-case.
SIGNATURE_HEADERS: Final = ("x-flowtide-signature", "x-hub-signature-256")
TIMESTAMP_HEADER: Final = "X-Flowtide-Timestamp"
#: The delivery id headers (flowtide's, GitHub's), lower-case, first found wins.
DELIVERY_HEADERS: Final = ("x-flowtide-delivery", "x-github-delivery")
#: The headers a run sees (`hook.headers`): what says what the delivery is, never a
#: signature, a cookie or a credential.
SHOWN_HEADERS: Final = frozenset(
    {
        "content-type",
        "user-agent",
        "x-flowtide-event",
        "x-flowtide-delivery",
        "x-flowtide-timestamp",
        "x-github-event",
        "x-github-delivery",
        "x-github-hook-id",
        "x-gitlab-event",
        "x-gitea-event",
    }
)
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
_RATE: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|sec|m|min|h|hour))?\s*", re.ASCII)
_PER: Final = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}
_DELIVERY: Final = re.compile(r"[\x21-\x7e]{1,200}", re.ASCII)
_HEX: Final = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)


def check_name(name: str) -> str:
    """A hook's name as it goes in its URL (`/api/hooks/NAME`).

    Raises:
        TriggerError: not 1-128 letters, digits, `_`, `.` or `-` (starting with a letter or
            a digit).
    """
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise TriggerError(
            "a hook's name is 1-128 letters, digits, '_', '.' or '-', starting with a"
            " letter or a digit",
            field="name",
        )
    return name


def parse_rate(text: str | float | None) -> float | None:
    """Deliveries a second from `N/s`, `N/m`, `N/h` or a bare number (per second); None
    for none given.

    Raises:
        TriggerError: not such a rate, or not above 0.
    """
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        rate = float(text) if abs(text) < 1e300 else math.inf  # no OverflowError
    else:
        found = _RATE.fullmatch(text)
        if found is None:
            raise TriggerError(f"rate {text!r}: write N/s, N/m or N/h", field="rate")
        rate = float(found[1]) / _PER[found[2]]
    if not math.isfinite(rate) or rate <= 0 or rate > 1_000_000:
        raise TriggerError("a rate is above 0 and at most 1000000/s", field="rate")
    return rate


def rate_text(rate: float | None) -> str:
    """How lists show a rate: `10/s`, `0.5/s`, `-` for the server's default."""
    return "-" if rate is None else f"{rate:g}/s"


def check_secret(secret: bytes, *, where: str = "the secret") -> bytes:
    """A hook secret as given (surrounding whitespace and a final newline dropped).

    Raises:
        TriggerError: empty, or over MAX_SECRET_BYTES.
    """
    secret = secret.strip()
    if not secret:
        raise TriggerError(f"{where} is empty", field="secret")
    if len(secret) > MAX_SECRET_BYTES:
        raise TriggerError(
            f"{where} is larger than {MAX_SECRET_BYTES} bytes (a hook's secret is a key,"
            " not a file)",
            field="secret",
        )
    return secret


def credential_secret(body: Mapping[str, Any], alias: str) -> bytes:
    """The secret a credential holds: its `secret` or `value` field, or its one string
    field.

    Raises:
        TriggerError: none of those (never says what the credential holds).
    """
    for key in ("secret", "value", "token"):
        if isinstance(body.get(key), str):
            return check_secret(body[key].encode(), where=f"credential {alias!r}'s secret")
    strings = [v for v in body.values() if isinstance(v, str)]
    if len(strings) == 1:
        return check_secret(strings[0].encode(), where=f"credential {alias!r}'s secret")
    raise TriggerError(
        f"credential {alias!r} has no `secret` or `value` field (nor one string field)",
        field="secret_credential",
    )


def _cipher(sealer: Sealer) -> Any:
    return sealer.key.cipher()


def store_sealer(store: Store) -> Sealer:
    """The sealer of `store` (both adapters have one: the master key of its home).

    Raises:
        TriggerError: a store without one.
    """
    sealer: Sealer | None = getattr(store, "sealer", None)
    if sealer is None:
        raise TriggerError("this store keeps no master key: it cannot keep a hook's secret")
    return sealer


def seal_secret(sealer: Sealer, secret: bytes) -> bytes:
    """The secret as stored: a Fernet token of the master key (as a credential's body),
    so `flowtide credential rotate-key` re-encrypts it with the credentials."""
    token: bytes = _cipher(sealer).encrypt(secret)
    return token


def unseal_secret(sealer: Sealer, sealed: bytes, name: str) -> bytes:
    """The secret a hook keeps.

    Raises:
        TriggerError: the master key is not the one it was sealed with.
    """
    from cryptography.fernet import InvalidToken

    try:
        try:
            plain: bytes = _cipher(sealer).decrypt(bytes(sealed))
        except InvalidToken:
            sealer.key.reload()  # another process may have rotated the key
            plain = _cipher(sealer).decrypt(bytes(sealed))
    except InvalidToken:
        raise TriggerError(
            f"hook {name!r}: its secret is sealed with another master key than {sealer.key.source}"
        ) from None
    return plain


def add_hook(
    store: Store,
    name: str,
    playbook: dict[str, Any],
    *,
    secret: bytes,
    workload: dict[str, Any] | None = None,
    rate: str | float | None = None,
    now: float | None = None,
) -> TriggerRow:
    """Store a hook (or replace the one of that name, which keeps its id and so its
    shard and firings), its secret sealed. Blocking.

    Raises:
        TriggerError: a bad name, secret or rate.
    """
    from flowtide.ids import new_id

    check_name(name)
    secret = check_secret(secret)
    if workload is not None and not isinstance(workload, dict):
        raise TriggerError("a hook's workload is a mapping of templates", field="workload")
    if workload is not None:
        from flowtide.triggers.spec import check_json_value

        check_json_value(workload, "workload", name=name, kind=HOOK)
    spec = {"playbook": playbook, "workload": workload, "rate": parse_rate(rate)}
    return store.put_trigger(
        HOOK,
        name,
        spec,
        trigger_id=new_id(),
        now=time.time() if now is None else now,
        secret=seal_secret(store_sealer(store), secret),
    )


def hook_secret(store: Store, name: str) -> bytes:
    """The secret hook `name` checks signatures with. Blocking.

    Raises:
        NotFoundError: no such hook, or it keeps no secret.
        TriggerError: the secret cannot be unsealed.
    """
    sealed = store.trigger_secret(HOOK, name)
    if sealed is None:
        raise NotFoundError(f"hook {name!r} keeps no secret")
    return unseal_secret(store_sealer(store), sealed, name)


# -- a delivery -------------------------------------------------------------------------


def sign(secret: bytes, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for `body` (and `timestamp`, when sent with one):
    `sha256=<hex>`. What a sender computes (and the tests, and `bench/hooks.py`)."""
    signed = body if timestamp is None else f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()


def verify(
    secret: bytes, body: bytes, headers: Mapping[str, str], *, now: float, window: float
) -> str | None:
    """Why a delivery is refused (None: it is signed with `secret`). `headers` are keyed
    in lower case. The signature is compared in constant time.

    With a timestamp header, the signature covers `<timestamp>.<body>` and the timestamp
    must be within `window` seconds of `now` either way (a replayed delivery is stale).
    """
    given = next((headers[h] for h in SIGNATURE_HEADERS if h in headers), None)
    if given is None:
        return "no signature"
    scheme, _, digest = given.strip().partition("=")
    if scheme.lower() != "sha256" or _HEX.fullmatch(digest) is None:
        return "malformed signature (expected sha256=<64 hex digits>)"
    stamp = headers.get(TIMESTAMP_HEADER.lower())
    timestamp = None
    if stamp is not None:
        try:
            timestamp = int(stamp.strip())
        except ValueError:
            return "malformed timestamp (expected Unix seconds)"
    expected = sign(secret, body, timestamp)[len("sha256=") :]
    if not hmac.compare_digest(expected.encode(), digest.lower().encode()):
        return "bad signature"
    if timestamp is not None and abs(now - timestamp) > window:
        return f"stale timestamp ({now - timestamp:+.0f} s, window {window:g} s)"
    return None


def delivery_id(headers: Mapping[str, str]) -> str | None:
    """The delivery id of `headers` (lower-case keys), None when there is none.

    Raises:
        TriggerError: one that is not 1-200 printable ASCII characters.
    """
    given = next((headers[h] for h in DELIVERY_HEADERS if h in headers), None)
    if given is None:
        return None
    given = given.strip()
    if _DELIVERY.fullmatch(given) is None:
        raise TriggerError("a delivery id is 1-200 printable ASCII characters", field="delivery")
    return given


def decode_body(body: bytes, content_type: str | None) -> Any:
    """The body as a run sees it: JSON parsed, a form as a mapping (a repeated field as a
    list), anything else as text.

    Raises:
        TriggerError: a JSON or form body that does not parse.
    """
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        if not body.strip():
            return None
        from flowtide.jsonvalues import MAX_DEPTH, nested_deeper

        try:
            parsed = json.loads(body)
        except ValueError:
            raise TriggerError("the body is not JSON", field="body") from None
        except RecursionError:
            parsed = None
        else:
            if not nested_deeper(parsed):
                return parsed
        raise TriggerError(f"the body nests more than {MAX_DEPTH} levels deep", field="body")
    if media == "application/x-www-form-urlencoded":
        try:
            parsed = parse_qs(
                body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body)
            )
        except (UnicodeDecodeError, ValueError):
            raise TriggerError("the body is not a form", field="body") from None
        return {k: v[0] if len(v) == 1 else v for k, v in parsed.items()}
    return body.decode("utf-8", "replace")


def shown_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a delivery a run sees (SHOWN_HEADERS)."""
    return {k: v for k, v in headers.items() if k in SHOWN_HEADERS}


def delivery_workload(
    template: dict[str, Any] | None,
    *,
    name: str,
    body: Any,
    headers: dict[str, str],
    delivery: str | None,
) -> dict[str, Any]:
    """The workload of a delivery's run: `{"body", "headers", "delivery"}`, or the hook's
    `workload` templates rendered with `hook.body`, `hook.headers`, `hook.delivery` and
    `hook.name`.

    Raises:
        TemplateError: a template that does not render.
    """
    if template is None:
        return {"body": body, "headers": headers, "delivery": delivery}
    from flowtide.triggers.targets import render_workload

    hook = {"name": name, "body": body, "headers": headers, "delivery": delivery}
    return render_workload(template, {"hook": hook})


# -- per server process ------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimits:
    """A token bucket per hook, in this process: a hook allowed `rate` deliveries a second
    takes bursts of up to max(1, rate) and then `rate` a second. Each server process
    counts its own deliveries (a hook's deliveries all reach the servers of its shard,
    so several servers of one shard each allow the rate)."""

    def __init__(self, *, max_hooks: int = 10_000) -> None:
        self._buckets: OrderedDict[int, _Bucket] = OrderedDict()
        self._max = max_hooks
        self._lock = threading.Lock()

    def take(self, hook: int, rate: float, now: float) -> float:
        """Take one delivery of `hook` at `now` (monotonic seconds): 0 when allowed, else
        the seconds until one would be."""
        burst = max(1.0, rate)
        with self._lock:
            bucket = self._buckets.get(hook)
            if bucket is None:
                bucket = self._buckets[hook] = _Bucket(burst, now)
                while len(self._buckets) > self._max:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(hook)
                bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
                bucket.at = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / rate


@dataclass
class Refusals:
    """The latest refused deliveries of each hook, in this process's memory only (a
    flood of bad requests must cost no writes): at most `per_hook` each, for at most
    `max_hooks` names (the oldest forgotten), so probing names fills nothing."""

    per_hook: int = 50
    max_hooks: int = 1000
    _seen: OrderedDict[str, deque[dict[str, Any]]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, status: int, why: str, delivery: str | None, now: float) -> None:
        entry = {"time": now, "status": status, "why": why, "delivery": delivery}
        with self._lock:
            ring = self._seen.get(name)
            if ring is None:
                ring = self._seen[name] = deque(maxlen=self.per_hook)
                while len(self._seen) > self.max_hooks:
                    self._seen.popitem(last=False)
            else:
                self._seen.move_to_end(name)
            ring.append(entry)

    def of(self, name: str) -> list[dict[str, Any]]:
        """The refusals of `name`, newest first."""
        with self._lock:
            return list(reversed(self._seen.get(name, ())))

    def forget(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)


#: The clock of a delivery's checks (wall seconds) and the one of rate buckets.
Clock = Callable[[], float]
