"""A playbook's `notify:` list (and the server-wide default, `FLOWTIDE_NOTIFY_DEFAULT`): who is told
when a run fails, completes, is cancelled, misses a deadline or is interrupted.

Each entry names the transitions it is for (`on:`, default `[failed]`) and exactly one
target: `webhook: {url, headers?, body?}`, `slack: {url, text?}`, `email: {to, from?,
subject?, body?, smtp: {host, port?, starttls?, credential?}}` or `playbook: {path,
version?}`. `parse_notify` checks a list and reports every problem through a callback,
so the loader gives them positions and the settings name the variable. Delivering is
`flowtide.notify`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = [
    "NOTIFY_ON",
    "TARGET_KINDS",
    "NotifyTarget",
    "parse_notify",
]

#: The transitions a notification can be for. `interrupted` is a run that the process
#: running it was found dead for; flowtide accepts it now and sends it when a run ends so
#: (an error of kind `interrupted`).
NOTIFY_ON: Final = ("failed", "completed", "cancelled", "deadline_missed", "interrupted")
TARGET_KINDS: Final = ("webhook", "slack", "email", "playbook")
#: Most targets one list may name (each transition sends to every matching one).
MAX_TARGETS: Final = 20

_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "webhook": frozenset({"url", "headers", "body"}),
    "slack": frozenset({"url", "text"}),
    "email": frozenset({"to", "from", "subject", "body", "smtp"}),
    "playbook": frozenset({"path", "version"}),
}
_SMTP_FIELDS: Final = frozenset({"host", "port", "starttls", "credential"})

#: report(path inside the list, message, field, expected)
Report = Callable[[tuple[str | int, ...], str, str, str | None], None]


@dataclass(frozen=True, slots=True)
class NotifyTarget:
    """One entry of a `notify:` list: the transitions it is for and its target."""

    on: tuple[str, ...]
    kind: str
    config: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"on": list(self.on), "kind": self.kind, "config": dict(self.config)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotifyTarget:
        return cls(tuple(data["on"]), str(data["kind"]), dict(data["config"]))


def _url_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be an http(s) URL"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"'{value.split('?')[0]}' is not an http(s) URL with a host"
    return None


def _check_target(kind: str, cfg: Any, at: tuple[str | int, ...], report: Report) -> bool:
    field = f"notify{''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in at)}"
    if not isinstance(cfg, dict):
        report(at, f"'{kind}' must be a mapping", field, f"{kind}: {{...}}")
        return False
    ok = True
    for key in cfg:
        if key not in _FIELDS[kind]:
            report(
                (*at, key),
                f"unknown field '{key}' of a {kind} target",
                f"{field}.{key}",
                "one of: " + ", ".join(sorted(_FIELDS[kind])),
            )
            ok = False

    def need_str(key: str, required: bool) -> None:
        nonlocal ok
        value = cfg.get(key)
        if value is None and not required:
            return
        if not isinstance(value, str) or not value:
            report((*at, key), f"{kind} target needs '{key}' (a string)", f"{field}.{key}", None)
            ok = False

    if kind in ("webhook", "slack"):
        problem = _url_problem(cfg.get("url"))
        if problem:
            report((*at, "url"), f"{kind} url {problem}", f"{field}.url", "http(s)://host/path")
            ok = False
        if kind == "webhook":
            headers = cfg.get("headers")
            if headers is not None and not (
                isinstance(headers, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
            ):
                report(
                    (*at, "headers"), "headers must map names to strings", f"{field}.headers", None
                )
                ok = False
            body = cfg.get("body")
            if body is not None and not isinstance(body, str | dict | list):
                report(
                    (*at, "body"), "body must be a template or a JSON value", f"{field}.body", None
                )
                ok = False
        else:
            need_str("text", False)
    elif kind == "email":
        to = cfg.get("to")
        if not (
            isinstance(to, str)
            and to
            or isinstance(to, list)
            and to
            and all(isinstance(t, str) and t for t in to)
        ):
            report(
                (*at, "to"), "email target needs 'to' (an address or a list)", f"{field}.to", None
            )
            ok = False
        need_str("from", False)
        need_str("subject", False)
        need_str("body", False)
        smtp = cfg.get("smtp")
        if not isinstance(smtp, dict) or not isinstance(smtp.get("host"), str):
            report(
                (*at, "smtp"),
                "email target needs 'smtp' with a 'host'",
                f"{field}.smtp",
                "smtp: {host, port, starttls, credential}",
            )
            ok = False
        else:
            for key in smtp:
                if key not in _SMTP_FIELDS:
                    report(
                        (*at, "smtp", key),
                        f"unknown field '{key}' of smtp",
                        f"{field}.smtp.{key}",
                        "one of: " + ", ".join(sorted(_SMTP_FIELDS)),
                    )
                    ok = False
            port = smtp.get("port", 587)
            if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                report(
                    (*at, "smtp", "port"), "smtp port must be 1-65535", f"{field}.smtp.port", None
                )
                ok = False
            if not isinstance(smtp.get("starttls", True), bool):
                report(
                    (*at, "smtp", "starttls"),
                    "starttls must be true or false",
                    f"{field}.smtp",
                    None,
                )
                ok = False
            cred = smtp.get("credential")
            if cred is not None and not (isinstance(cred, str) and cred):
                report(
                    (*at, "smtp", "credential"),
                    "credential must be a credential's name",
                    f"{field}.smtp.credential",
                    None,
                )
                ok = False
    else:
        need_str("path", True)
        version = cfg.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            report((*at, "version"), "version must be an integer", f"{field}.version", None)
            ok = False
    return ok


def parse_notify(raw: Any, report: Report) -> tuple[NotifyTarget, ...]:
    """The targets of a `notify:` value; every problem goes to `report` (an entry with
    one is left out)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        report(
            (),
            "'notify' must be a list of targets",
            "notify",
            "notify: [{on: [failed], webhook: {url}}]",
        )
        return ()
    if len(raw) > MAX_TARGETS:
        report((), f"'notify' names {len(raw)} targets, more than {MAX_TARGETS}", "notify", None)
        return ()
    out: list[NotifyTarget] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            report((i,), "a notify entry must be a mapping", f"notify[{i}]", None)
            continue
        on_raw = entry.get("on", ["failed"])
        if isinstance(on_raw, str):
            on_raw = [on_raw]
        bad = [str(o) for o in on_raw if o not in NOTIFY_ON] if isinstance(on_raw, list) else ["?"]
        if bad or not on_raw:
            report(
                (i, "on") if "on" in entry else (i,),
                f"unknown transition {', '.join(repr(b) for b in bad) or '(none)'} in 'on'",
                f"notify[{i}].on",
                "a list of: " + ", ".join(NOTIFY_ON),
            )
            continue
        kinds = [k for k in TARGET_KINDS if k in entry]
        extra = [k for k in entry if k != "on" and k not in TARGET_KINDS]
        if extra:
            report(
                (i, extra[0]),
                f"unknown key '{extra[0]}' in a notify entry",
                f"notify[{i}].{extra[0]}",
                "on and one of: " + ", ".join(TARGET_KINDS),
            )
            continue
        if len(kinds) != 1:
            report(
                (i,),
                "a notify entry needs exactly one target"
                + (f" (it has {', '.join(kinds)})" if kinds else ""),
                f"notify[{i}]",
                "one of: " + ", ".join(TARGET_KINDS),
            )
            continue
        kind = kinds[0]
        if _check_target(kind, entry[kind], (i, kind), report):
            out.append(NotifyTarget(tuple(dict.fromkeys(on_raw)), kind, dict(entry[kind])))
    return tuple(out)
