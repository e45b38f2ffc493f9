"""A subscription as written (CLI flags, an API body, a `kind: Subscription` document)
and as stored. Pure: validation only, every error a `TriggerError` naming the
subscription, the field and, for a document, where it was written (`file:line:column`).

The fields are NoETL's (`kind: Subscription`, its `subscription` tool): `source`
(`nats` built in; others are plugins of the entry point group `flowtide.sources`),
`auth` (a credential alias whose body has the server's `url` and `user`/`password` or
`creds`), `subject`, `stream`/`consumer` (JetStream), `batch: {size, max_wait}`; and
flowtide's `rate` (`N/s`), `ack_wait`, `max_deliver`, `workload`, `paused`, `config`
(a plugin source's own fields).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from flowtide.errors import TriggerError
from flowtide.triggers.spec import MAX_VERSION, Positions, check_json_value, validate_name
from flowtide.triggers.when import parse_duration

__all__ = [
    "Batch",
    "SubscriptionSpec",
    "consumer_name",
    "parse_rate",
    "subscription_from_document",
    "subscription_from_json",
    "subscription_to_json",
]

KIND: Final = "subscription"
SPEC_FIELDS: Final = (
    "playbook",
    "version",
    "source",
    "auth",
    "url",
    "subject",
    "stream",
    "consumer",
    "workload",
    "batch",
    "rate",
    "ack_wait",
    "max_deliver",
    "paused",
    "config",
)
_TOP_FIELDS: Final = ("apiVersion", "kind", "metadata", "spec")
_API_VERSIONS: Final = ("noetl.io/v2", "noetl.io/v1", "flowtide.io/v1")
_SUBJECT: Final = re.compile(r"^[^\s]{1,255}$")
_STREAM: Final = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_SOURCE: Final = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_RATE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER: Final = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
#: The largest batch (messages one listener holds unacknowledged at once).
MAX_BATCH: Final = 1000
MAX_WORKLOAD_KEYS: Final = 1000
#: What an `auth` mapping may hold: the credential's alias, and a server or a user name
#: overriding the credential's (never a secret, never a file).
AUTH_FIELDS: Final = (
    "credential",
    "key",
    "alias",
    "url",
    "nats_url",
    "server",
    "servers",
    "user",
    "username",
    "nats_user",
)
#: The most deliveries of a message whose run cannot start.
MAX_DELIVER: Final = 10_000


@dataclass(frozen=True, slots=True)
class Batch:
    """One run per `size` messages, or fewer when `max_wait` seconds pass first."""

    size: int
    max_wait: float = 1.0


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """A checked subscription (see the README's "Subscriptions")."""

    name: str
    #: A catalog path, or (on a local store) an absolute file path.
    playbook: str
    source: str = "nats"
    version: int | None = None
    #: A credential alias (or a mapping with `credential` and fields overriding it).
    auth: str | dict[str, Any] | None = None
    url: str | None = None
    subject: str | None = None
    stream: str | None = None
    consumer: str | None = None
    workload: dict[str, Any] = field(default_factory=dict)
    batch: Batch | None = None
    #: Messages per second at most (None: as fast as runs start).
    rate: float | None = None
    #: JetStream: how long a delivered message waits for its ack before redelivery.
    ack_wait: float = 30.0
    #: Deliveries of a message whose run cannot start before it is dropped.
    max_deliver: int = 5
    paused: bool = False
    #: A plugin source's own fields.
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def consumer_name(spec: SubscriptionSpec) -> str:
    """The durable consumer the listeners share: `consumer`, else `flowtide-sub-<name>`."""
    return spec.consumer or f"flowtide-sub-{spec.name}".replace(".", "_")


def parse_rate(value: object, field_name: str = "rate") -> float:
    """Messages per second of `100/s`, `30/m`, `5/h`, or a number (per second).
    Raises TriggerError."""
    if isinstance(value, bool):
        raise TriggerError(f"{value!r} is not a rate", field=field_name, kind=KIND)
    if isinstance(value, int | float):
        rate = float(value) if abs(value) < 1e300 else math.inf  # no OverflowError
    elif isinstance(value, str) and (m := _RATE.match(value)):
        rate = float(m.group(1)) / _PER.get(m.group(2), 3600)
    else:
        raise TriggerError(
            f"{value!r} is not a rate (like 100/s, 30/m)", field=field_name, kind=KIND
        )
    if not math.isfinite(rate) or rate <= 0:
        raise TriggerError(f"rate must be above 0, not {value!r}", field=field_name, kind=KIND)
    return rate


class _SubReader:
    """Reads one document's fields, each error naming where it was written."""

    def __init__(self, name: str | None, source: str | None, positions: Positions | None):
        self.name = name
        self.source = source
        self.positions = positions

    def where(self, path: tuple[Any, ...]) -> str | None:
        if self.positions is not None:
            probe = path
            while True:
                found = self.positions.get(probe)
                if (
                    isinstance(found, tuple)
                    and len(found) == 2
                    and all(isinstance(n, int) for n in found)
                ):
                    return f"{self.source or '<document>'}:{found[0]}:{found[1]}"
                if not probe:
                    break
                probe = probe[:-1]
        return self.source

    def fail(self, path: tuple[Any, ...], message: str, field_name: str) -> TriggerError:
        return TriggerError(
            message, name=self.name, field=field_name, location=self.where(path), kind=KIND
        )

    def unknown(
        self, keys: Mapping[str, Any], allowed: tuple[str, ...], path: tuple[Any, ...]
    ) -> None:
        for key in keys:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    (*path, key),
                    f"unknown field {key!r}{hint}; a subscription has {', '.join(allowed)}",
                    str(key),
                )


def subscription_from_document(
    doc: Any, *, source: str | None = None, positions: Positions | None = None
) -> SubscriptionSpec:
    """The subscription a `kind: Subscription` document defines. `source` names the file
    and `positions` locate its fields (`flowtide.playbook.source.load_yaml`).

    Raises:
        TriggerError: naming the subscription, the field and where it was written.
    """
    top = _SubReader(None, source, positions)
    if not isinstance(doc, Mapping):
        raise top.fail((), "a subscription must be a YAML mapping (kind: Subscription)", "kind")
    top.unknown(doc, _TOP_FIELDS, ())
    if doc.get("kind") != "Subscription":
        raise top.fail(("kind",), f"kind must be Subscription, not {doc.get('kind')!r}", "kind")
    api = doc.get("apiVersion")
    if api is not None and api not in _API_VERSIONS:
        raise top.fail(
            ("apiVersion",),
            f"apiVersion {api!r} is not one of {', '.join(_API_VERSIONS)}",
            "apiVersion",
        )
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or "name" not in meta:
        raise top.fail(("metadata",), "metadata.name names the subscription", "metadata.name")
    top.unknown(meta, ("name", "description", "labels"), ("metadata",))
    try:
        name = validate_name(meta["name"])
    except TriggerError as exc:
        raise top.fail(("metadata", "name"), exc.message, "metadata.name") from None
    description = meta.get("description") or ""
    if not isinstance(description, str) or len(description) > 1000:
        raise top.fail(("metadata", "description"), "a line of text (at most 1,000)", "description")
    spec = doc.get("spec")
    r = _SubReader(name, source, positions)
    if not isinstance(spec, Mapping):
        raise r.fail(("spec",), "spec must be a mapping (playbook, source, ...)", "spec")
    r.unknown(spec, SPEC_FIELDS, ("spec",))
    return _read_spec(r, name, description, spec)


def _text(r: _SubReader, spec: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.match(value):
        raise r.fail(("spec", key), f"{key} {value!r} is not valid", key)
    return value


def _read_spec(
    r: _SubReader, name: str, description: str, spec: Mapping[str, Any]
) -> SubscriptionSpec:
    at = ("spec",)
    playbook = spec.get("playbook")
    version = spec.get("version")
    if isinstance(playbook, Mapping):
        r.unknown(playbook, ("path", "version"), (*at, "playbook"))
        version = playbook.get("version", version)
        playbook = playbook.get("path")
    if not isinstance(playbook, str) or not playbook.strip() or len(playbook) > 4096:
        raise r.fail((*at, "playbook"), "name the playbook: a catalog path", "playbook")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION
    ):
        raise r.fail(
            (*at, "version"),
            f"version must be a number from 1 to {MAX_VERSION}, not {version!r}",
            "version",
        )
    source = spec.get("source", "nats")
    if not isinstance(source, str) or not _SOURCE.match(source):
        raise r.fail((*at, "source"), f"source {source!r} is not a source name", "source")
    auth = spec.get("auth")
    if auth is not None and not (
        (isinstance(auth, str) and 0 < len(auth) <= 256) or isinstance(auth, Mapping)
    ):
        raise r.fail((*at, "auth"), "auth names a credential (or is a mapping)", "auth")
    if isinstance(auth, Mapping):
        _check_auth_mapping(r, auth)
    url = spec.get("url")
    if url is not None and (not isinstance(url, str) or not url.strip() or len(url) > 2048):
        raise r.fail((*at, "url"), "url must be a server URL (nats://host:4222)", "url")
    if url is not None and "@" in url:
        # Definitions are shown to readers: a password belongs in a credential. (A
        # server without a scheme is a URL too: `user:pw@host:4222` gets nats://.)
        raise r.fail(
            (*at, "url"),
            "url carries credentials: put them in a credential and name it in auth",
            "url",
        )
    subject = _text(r, spec, "subject", _SUBJECT)
    stream = _text(r, spec, "stream", _STREAM)
    consumer = _text(r, spec, "consumer", _STREAM)
    if source == "nats":
        if auth is None and url is None:
            raise r.fail(at, "name the server: auth (a credential with its url) or url", "auth")
        if stream is None and subject is None:
            raise r.fail(at, "give a subject (core NATS) or a stream (JetStream)", "subject")
        if consumer is not None and stream is None:
            raise r.fail((*at, "consumer"), "consumer goes with stream (JetStream)", "consumer")
    workload = spec.get("workload") or {}
    if not isinstance(workload, Mapping):
        raise r.fail((*at, "workload"), "workload must be a mapping", "workload")
    if len(workload) > MAX_WORKLOAD_KEYS:
        raise r.fail((*at, "workload"), f"more than {MAX_WORKLOAD_KEYS} keys", "workload")
    config = spec.get("config") or {}
    if not isinstance(config, Mapping):
        raise r.fail((*at, "config"), "config must be a mapping (the source's fields)", "config")
    for key, value in (("workload", workload), ("config", config)):
        try:
            check_json_value(value, key, name=name, kind=KIND)
        except TriggerError as exc:
            raise r.fail((*at, key), exc.message, key) from None
    paused = spec.get("paused", False)
    if not isinstance(paused, bool):
        raise r.fail((*at, "paused"), f"paused must be true or false, not {paused!r}", "paused")
    values: dict[str, Any] = {}
    try:
        if spec.get("rate") is not None:
            values["rate"] = parse_rate(spec["rate"])
        if spec.get("ack_wait") is not None:
            values["ack_wait"] = parse_duration(spec["ack_wait"], field="ack_wait")
            if values["ack_wait"] < 1:
                raise TriggerError("ack_wait must be 1s or more", field="ack_wait")
    except TriggerError as exc:
        key = exc.field or "rate"
        raise r.fail((*at, key), exc.message, key) from None
    max_deliver = spec.get("max_deliver")
    if max_deliver is not None:
        if (
            isinstance(max_deliver, bool)
            or not isinstance(max_deliver, int)
            or not 1 <= max_deliver <= MAX_DELIVER
        ):
            raise r.fail(
                (*at, "max_deliver"),
                f"max_deliver must be a number from 1 to {MAX_DELIVER}",
                "max_deliver",
            )
        values["max_deliver"] = max_deliver
    batch = spec.get("batch")
    if batch is not None:
        values["batch"] = _read_batch(r, batch)
    return SubscriptionSpec(
        name=name,
        playbook=playbook.strip(),
        version=version,
        source=source,
        auth=dict(auth) if isinstance(auth, Mapping) else auth,
        url=url.strip() if isinstance(url, str) else None,
        subject=subject,
        stream=stream,
        consumer=consumer,
        workload=dict(workload),
        paused=paused,
        config=dict(config),
        description=description,
        **values,
    )


def _check_auth_mapping(r: _SubReader, auth: Mapping[str, Any]) -> None:
    """An `auth` mapping names a credential and may override its server and user: a
    secret belongs in the credential (a definition is stored and shown), and so does a
    file (a path would be read by the process that listens, a server)."""
    path = ("spec", "auth")
    for key, value in auth.items():
        if key not in AUTH_FIELDS:
            raise r.fail(
                (*path, key),
                f"auth.{key}: an auth mapping holds {', '.join(AUTH_FIELDS)}; passwords,"
                " tokens and files belong in the credential it names",
                "auth",
            )
        if not isinstance(value, str) or len(value) > 2048:
            raise r.fail((*path, key), f"auth.{key} must be a string", "auth")
        if "@" in value and key not in ("credential", "key", "alias"):
            raise r.fail(
                (*path, key), f"auth.{key} carries credentials: put them in a credential", "auth"
            )


def _read_batch(r: _SubReader, batch: Any) -> Batch:
    at = ("spec", "batch")
    if isinstance(batch, int) and not isinstance(batch, bool):
        batch = {"size": batch}
    if not isinstance(batch, Mapping):
        raise r.fail(at, "batch must be a mapping: {size, max_wait}", "batch")
    r.unknown(batch, ("size", "max_wait"), at)
    size = batch.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH:
        raise r.fail((*at, "size"), f"batch.size must be 1..{MAX_BATCH}, not {size!r}", "batch")
    wait = 1.0
    if batch.get("max_wait") is not None:
        try:
            wait = parse_duration(batch["max_wait"], field="max_wait")
        except TriggerError as exc:
            raise r.fail((*at, "max_wait"), exc.message, "batch") from None
        if not 0 < wait <= 3600:
            raise r.fail((*at, "max_wait"), "batch.max_wait must be in (0, 1h]", "batch")
    return Batch(size=size, max_wait=wait)


def subscription_to_json(spec: SubscriptionSpec) -> dict[str, Any]:
    """The stored form (JSON values only; `auth` is an alias, never a secret)."""
    return {
        "name": spec.name,
        "playbook": spec.playbook,
        "version": spec.version,
        "source": spec.source,
        "auth": spec.auth,
        "url": spec.url,
        "subject": spec.subject,
        "stream": spec.stream,
        "consumer": spec.consumer,
        "workload": spec.workload,
        "batch": None
        if spec.batch is None
        else {"size": spec.batch.size, "max_wait": spec.batch.max_wait},
        "rate": spec.rate,
        "ack_wait": spec.ack_wait,
        "max_deliver": spec.max_deliver,
        "paused": spec.paused,
        "config": spec.config,
        "description": spec.description,
    }


def subscription_from_json(doc: Mapping[str, Any]) -> SubscriptionSpec:
    """`subscription_to_json`'s inverse. Raises TriggerError on a form it cannot read."""
    try:
        batch = doc.get("batch")
        return SubscriptionSpec(
            name=str(doc["name"]),
            playbook=str(doc["playbook"]),
            version=doc.get("version"),
            source=str(doc.get("source") or "nats"),
            auth=doc.get("auth"),
            url=doc.get("url"),
            subject=doc.get("subject"),
            stream=doc.get("stream"),
            consumer=doc.get("consumer"),
            workload=dict(doc.get("workload") or {}),
            batch=None
            if not batch
            else Batch(int(batch["size"]), float(batch.get("max_wait") or 1.0)),
            rate=None if doc.get("rate") is None else float(doc["rate"]),
            ack_wait=float(doc.get("ack_wait") or 30.0),
            max_deliver=int(doc.get("max_deliver") or 5),
            paused=bool(doc.get("paused", False)),
            config=dict(doc.get("config") or {}),
            description=str(doc.get("description") or ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TriggerError(f"a stored subscription cannot be read: {exc}", kind=KIND) from None
