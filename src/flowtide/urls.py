"""Showing connection URLs without their secrets (nats://, postgresql://, ... and lists
of them separated by commas)."""

from __future__ import annotations

from urllib.parse import unquote

__all__ = ["redact_url", "scrub_url"]


def _url_parts(url: str) -> list[tuple[str, str, str]]:
    """(scheme, userinfo, rest) of each comma-separated server URL; userinfo is "" when
    there is none. The last '@' ends the userinfo, as urlsplit has it, but without
    urlsplit's ValueError on a malformed URL: an error message must never fail to hide
    a password."""
    parts = []
    for part in url.split(","):
        scheme, sep, rest = part.partition("://")
        userinfo, at, host = rest.rpartition("@")
        if not sep or not at:
            parts.append((part, "", ""))
        else:
            parts.append((scheme, userinfo, host))
    return parts


def redact_url(url: str) -> str:
    """`url` with its password (or a lone token: nats://TOKEN@host) shown as ***."""
    out = []
    for scheme, userinfo, host in _url_parts(url):
        if not userinfo:
            out.append(scheme)
            continue
        user, colon, _ = userinfo.partition(":")
        out.append(f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://***@{host}")
    return ",".join(out)


def scrub_url(text: str, url: str) -> str:
    """Hide `url`'s secrets in `text` (an adapter or driver message may quote the URL)."""
    text = text.replace(url, redact_url(url))
    for _, userinfo, _ in _url_parts(url):
        if not userinfo:
            continue
        _, colon, password = userinfo.partition(":")
        secret = password if colon else userinfo
        for value in {secret, unquote(secret)} - {""}:
            text = text.replace(f":{value}@", ":***@").replace(f"//{value}@", "//***@")
            # A bare short secret would also match ordinary words of the message.
            if len(value) >= 4:
                text = text.replace(value, "***")
    return text
