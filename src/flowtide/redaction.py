"""Masking secrets in what is shown — never in what is stored or read by steps.

Display paths (API responses and the event stream, the CLI's `run`, `status` and
`events` output, server and worker logs) replace each value of an execution's secret set
with `***`. Data stays intact: stored values are sealed instead (`flowtide.sealing`), and
later steps read exactly what a tool returned.

How a value is matched depends on how safely it can be: a value of at least
`MIN_SAFE_LENGTH` characters that is not a common word is masked wherever it appears; a
shorter or common one (NoETL's default password `demo`) only where it stands as a whole
word (not next to a letter, digit or underscore), so `demo` is masked in `user=demo` and
`demo:demo@host` but `demographics` and `demo_noetl` stay readable. Such a value
is reported by `weak_reason`: `credential set` warns about it, and so does the first step
that uses it, naming the credential and field, never the value.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import lru_cache
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = [
    "MASK",
    "MIN_SAFE_LENGTH",
    "install_log_masking",
    "known",
    "mask_event_doc",
    "mask_text",
    "mask_value",
    "masked_url",
    "remember",
    "warn_weak_credential",
    "weak_fields",
    "weak_message",
    "weak_reason",
]

MASK: Final = "***"
MIN_SAFE_LENGTH: Final = 8
# Values that occur in ordinary text often enough that masking them as substrings would
# garble it (and that no one should use as a secret anyway).
_COMMON: Final = frozenset(
    {
        "admin",
        "administrator",
        "changeme",
        "default",
        "demo",
        "flowtide",
        "guest",
        "letmein",
        "noetl",
        "password",
        "postgres",
        "qwerty",
        "root",
        "secret",
        "test",
        "user",
        "welcome",
    }
)
# Credential fields whose values tools treat as secrets (postgres and spark passwords,
# http tokens, header values, api keys).
_SECRET_FIELD: Final = re.compile(r"pass|pwd|secret|token|key|value|auth", re.IGNORECASE)

log = logging.getLogger("flowtide.credentials")


def weak_reason(value: str) -> str | None:
    """Why `value` is too weak to mask everywhere it appears (None when it is not)."""
    if value.lower() in _COMMON:
        return "a common word"
    if len(value) < MIN_SAFE_LENGTH:
        return f"shorter than {MIN_SAFE_LENGTH} characters"
    return None


def weak_fields(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) of the secret fields of a credential body whose value is weak (an
    http credential's `headers` are secrets, each of them)."""
    candidates = [(str(f), v) for f, v in body.items() if _SECRET_FIELD.search(str(f))]
    headers = body.get("headers")
    if isinstance(headers, Mapping):
        candidates += [(f"headers.{name}", value) for name, value in headers.items()]
    out = []
    for field, value in candidates:
        if isinstance(value, str) and value:
            reason = weak_reason(value)
            if reason is not None:
                out.append((field, reason))
    return out


def weak_message(name: str, field: str, reason: str) -> str:
    """The warning about field `field` of credential `name` (never its value)."""
    return (
        f"credential '{name}': the value of '{field}' is {reason}, too weak to redact "
        f"safely: output masks it only where it stands as a whole word; use a value of "
        f"{MIN_SAFE_LENGTH} or more characters that is not a common word"
    )


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_weak_credential(name: str, body: Mapping[str, Any]) -> None:
    """Log, once per process and field, that credential `name` holds a weak secret."""
    for field, reason in weak_fields(body):
        with _warned_lock:
            if (name, field) in _warned:
                continue
            _warned.add((name, field))
        log.warning("%s", weak_message(name, field, reason))


# -- masking ------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def _pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    alternatives = []
    # Longest first: a secret that contains another is masked whole.
    for value in sorted((s for s in secrets if s), key=len, reverse=True):
        escaped = re.escape(value)
        if weak_reason(value) is not None:
            escaped = rf"(?<!\w){escaped}(?!\w)"
        alternatives.append(escaped)
    return re.compile("|".join(alternatives)) if alternatives else None


def _frozen(secrets: Iterable[str]) -> frozenset[str]:
    return secrets if isinstance(secrets, frozenset) else frozenset(secrets)


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every value of `secrets` replaced by `***` (see the module docstring)."""
    pattern = _pattern(_frozen(secrets))
    return text if pattern is None else pattern.sub(MASK, text)


def mask_value(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of the JSON-like `value` with `mask_text` applied to every string in it (keys
    included); `value` itself when there is nothing to mask."""
    pattern = _pattern(_frozen(secrets))
    if pattern is None:
        return value
    return _masked(value, pattern.sub)


def _masked(value: Any, sub: Callable[[str, str], str]) -> Any:
    if isinstance(value, str):
        return sub(MASK, value)
    if isinstance(value, Mapping):
        return {
            (sub(MASK, k) if isinstance(k, str) else k): _masked(v, sub) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked(v, sub) for v in value]
    return value


#: A path segment taken for a token: 16 characters or more of a token's alphabet, one a
#: digit (`/api/webhooks/123/AbC9...`); words (`/notifications-endpoint`) stay readable.
_TOKEN_SEGMENT = re.compile(r"(?=[^/]*\d)[A-Za-z0-9_.~%=+-]{16,}")


def masked_url(url: str, *, path: bool = True) -> str:
    """A URL as events and pages show it: scheme, host, port and path, never a user,
    password, query string or fragment; a path segment that looks like a token as `…`.
    With `path` False only the first path segment is kept (a Slack incoming webhook's
    path is its secret: `https://hooks.slack.com/services/…`)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an invalid URL)"
    segments = parts.path.split("/")
    if not path and len(segments) > 2:
        segments = [*segments[:2], "…"]
    shown = "/".join("…" if _TOKEN_SEGMENT.fullmatch(s) else s for s in segments)
    return f"{parts.scheme}://{host}{port}{shown}"


def mask_event_doc(doc: dict[str, Any], secrets: Collection[str]) -> dict[str, Any]:
    """An event document (`Event.to_dict()` shape) with its payload and error masked."""
    if not secrets:
        return doc
    return {
        **doc,
        "payload": mask_value(doc.get("payload"), secrets),
        "error": mask_value(doc.get("error"), secrets),
    }


# -- logs ---------------------------------------------------------------------------------

# Every secret this process has met (a worker's tools, a server's executions). Logs are
# masked with all of them: a log line does not say which execution it belongs to.
_known: frozenset[str] = frozenset()
_known_lock = threading.Lock()


def remember(values: Iterable[str]) -> None:
    """Add `values` to the secrets this process masks in its logs."""
    global _known
    new = {v for v in values if isinstance(v, str) and v}
    if new <= _known:
        return
    with _known_lock:
        _known = _known | new


def known() -> frozenset[str]:
    """The secrets this process masks in its logs and error replies."""
    return _known


_installed = False


def install_log_masking() -> None:
    """Mask known secrets in every log record this process makes from now on (its message,
    arguments and traceback), whichever logger or handler it goes through."""
    global _installed
    with _known_lock:
        if _installed:
            return
        _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        secrets = _known
        if secrets:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a bad format string is logging's to report
                return record
            record.msg = mask_text(message, secrets)
            record.args = None
            if record.exc_info and record.exc_info[0] is not None:
                text = logging.Formatter().formatException(record.exc_info)
                record.exc_text = mask_text(text, secrets)
                record.exc_info = None
        return record

    logging.setLogRecordFactory(factory)
