"""Keys, bucket names and filters as ADR-8 has them, and the reversible encoding that
turns any text into a key token.

Keys: `[-/_=.a-zA-Z0-9]+`, no leading or trailing `.`, no empty token, the `_kv` prefix
reserved. Filters are keys whose tokens may also be `*` (exactly one token) or a final
`>` (one or more tokens), as NATS subjects.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from flowtide.kv.errors import InvalidKeyError

__all__ = [
    "MAX_KEY_LENGTH",
    "KeyFilter",
    "decode_key_token",
    "encode_key_token",
    "validate_bucket_name",
    "validate_filter",
    "validate_key",
]

#: The longest key or filter: nats-server closes a connection whose protocol line
#: (`HPUB $KV.<bucket>.<key> <reply> <sizes>`) passes 4096 bytes, and a handle whose
#: connection closed that way stays closed. 3072 leaves room for the longest bucket name
#: JetStream takes (252) and a reply subject.
MAX_KEY_LENGTH = 3072

_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_TOKEN_RE = re.compile(r"[-/_=a-zA-Z0-9]+")
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_HEX2_RE = re.compile(r"[0-9A-Fa-f]{2}")
# Characters encode_key_token keeps as they are; `=` is the escape character so it is
# escaped itself, which keeps the mapping reversible.
_PLAIN_TOKEN_CHARS = frozenset("-_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def validate_bucket_name(name: str) -> str:
    """Check a bucket name against ADR-8 (`[a-zA-Z0-9_-]+`).

    Args:
        name: the bucket name.
    Returns:
        `name` unchanged.
    Raises:
        InvalidKeyError: (kind "bucket") the name is not valid.
    """
    if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
        raise InvalidKeyError(str(name), "allowed characters are [a-zA-Z0-9_-]", kind="bucket")
    return name


def validate_key(key: str, *, bucket: str | None = None) -> str:
    """Check a key against ADR-8 (wildcards are not allowed in keys).

    Args:
        key: the key.
        bucket: named in the error, if given.
    Returns:
        `key` unchanged.
    Raises:
        InvalidKeyError: the key is not valid.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(str(key), "a key is a non-empty string", bucket=bucket)
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            key[:64] + "...", f"a key has at most {MAX_KEY_LENGTH} characters", bucket=bucket
        )
    if not _KEY_RE.fullmatch(key):
        raise InvalidKeyError(key, "allowed characters are [-/_=.a-zA-Z0-9]", bucket=bucket)
    if key[0] == "." or key[-1] == ".":
        raise InvalidKeyError(key, "a key may not start or end with '.'", bucket=bucket)
    if ".." in key:
        raise InvalidKeyError(key, "empty token", bucket=bucket)
    if key.startswith("_kv"):
        raise InvalidKeyError(key, "keys starting with '_kv' are reserved", bucket=bucket)
    return key


def validate_filter(pattern: str, *, bucket: str | None = None) -> str:
    """Check a key filter: a key whose tokens may be `*`, or `>` as the last token.

    Args:
        pattern: the filter; "" means the whole bucket (as ADR-8's empty watch key).
        bucket: named in the error, if given.
    Returns:
        The filter, with "" normalised to ">".
    Raises:
        InvalidKeyError: (kind "filter") the filter is not valid.
    """
    if not isinstance(pattern, str):
        raise InvalidKeyError(str(pattern), "a filter is a string", kind="filter", bucket=bucket)
    if pattern == "":
        return ">"
    if len(pattern) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            pattern[:64] + "...",
            f"a filter has at most {MAX_KEY_LENGTH} characters",
            kind="filter",
            bucket=bucket,
        )
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token == "*":
            continue
        if token == ">":
            if i != len(tokens) - 1:
                raise InvalidKeyError(
                    pattern, "'>' must be the last token", kind="filter", bucket=bucket
                )
            continue
        if not token:
            raise InvalidKeyError(pattern, "empty token", kind="filter", bucket=bucket)
        if not _TOKEN_RE.fullmatch(token):
            raise InvalidKeyError(
                pattern,
                "tokens are '*', a final '>', or [-/_=a-zA-Z0-9]+",
                kind="filter",
                bucket=bucket,
            )
    return pattern


class KeyFilter:
    """A compiled set of filters; a key matches when any filter matches it."""

    __slots__ = ("filters", "literals", "_patterns", "match_all")

    def __init__(self, filters: str | Sequence[str], *, bucket: str | None = None) -> None:
        """Compile `filters`.

        Args:
            filters: one filter or a sequence of them (at least one).
            bucket: named in errors, if given.
        Raises:
            InvalidKeyError: a filter is invalid or the sequence is empty.
        """
        items = [filters] if isinstance(filters, str) else list(filters)
        if not items:
            raise InvalidKeyError("", "no filter given", kind="filter", bucket=bucket)
        self.filters: tuple[str, ...] = tuple(validate_filter(f, bucket=bucket) for f in items)
        self.match_all = ">" in self.filters
        # Literal filters are answered by a dictionary lookup instead of a scan.
        self.literals: frozenset[str] = frozenset(
            f for f in self.filters if "*" not in f.split(".") and not f.endswith(">")
        )
        self._patterns: tuple[tuple[str, ...], ...] = tuple(
            tuple(f.split(".")) for f in self.filters if f not in self.literals
        )

    @property
    def literal_only(self) -> bool:
        """True when every filter is a plain key (no wildcard)."""
        return not self._patterns

    def matches(self, key: str) -> bool:
        """Return whether `key` matches any of the filters."""
        if self.match_all or key in self.literals:
            return True
        if not self._patterns:
            return False
        tokens = key.split(".")
        return any(_tokens_match(p, tokens) for p in self._patterns)


def _tokens_match(pattern: tuple[str, ...], tokens: list[str]) -> bool:
    for i, want in enumerate(pattern):
        if want == ">":
            # '>' needs at least one token to match, as in NATS.
            return len(tokens) > i
        if i >= len(tokens):
            return False
        if want != "*" and want != tokens[i]:
            return False
    return len(tokens) == len(pattern)


# ------------------------------------------------------------------- key encoding


def encode_key_token(name: str) -> str:
    """Map an arbitrary name (a step name, say) to one valid key token.

    Letters, digits, `-` and `_` are kept; every other character, `.`, `/` and `=`
    included, becomes `=XX` for each byte of its UTF-8 encoding (upper-case hex). The
    result never contains `.`, so it is exactly one token, and `decode_key_token`
    reverses it.

    Args:
        name: any non-empty string.
    Returns:
        The encoded token, e.g. "fetch.users/v2" -> "fetch=2Eusers=2Fv2".
    Raises:
        InvalidKeyError: `name` is empty (an empty token is not a valid key part).
    """
    if not name:
        raise InvalidKeyError(name, "cannot encode an empty name as a key token")
    out: list[str] = []
    for ch in name:
        if ch in _PLAIN_TOKEN_CHARS:
            out.append(ch)
        else:
            out.extend(f"={b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_key_token(token: str) -> str:
    """Reverse `encode_key_token`.

    Args:
        token: a token produced by `encode_key_token`.
    Returns:
        The original name.
    Raises:
        InvalidKeyError: the token holds a malformed escape.
    """
    raw = bytearray()
    i = 0
    while i < len(token):
        ch = token[i]
        if ch == "=":
            digits = token[i + 1 : i + 3]
            if not _HEX2_RE.fullmatch(digits):
                raise InvalidKeyError(token, f"bad escape at offset {i}")
            raw.append(int(digits, 16))
            i += 3
        else:
            raw.extend(ch.encode("utf-8"))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidKeyError(token, "escapes do not form UTF-8") from None
