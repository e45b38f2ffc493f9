"""Which token a client sends to a flowtide server (the CLI, the worker, the Python client).

In this order, the first that is set:

1. the token given in code (`ServerClient(url, token=...)`, `flowtide worker --token-file`);
2. `FLOWTIDE_TOKEN`;
3. the file named by `FLOWTIDE_TOKEN_FILE` (its first line);
4. on the machine that runs `flowtide dev up`, for that stack's server URL only, the
   admin token the stack created (`<home>/dev/tokens.json`, mode 0600), so that the
   README's commands work right after `dev up`.
"""

from __future__ import annotations

import json
from pathlib import Path

from flowtide.errors import FlowtideError

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "read_token_file", "resolve_token"]

TOKEN_ENV = "FLOWTIDE_TOKEN"
TOKEN_FILE_ENV = "FLOWTIDE_TOKEN_FILE"
#: Where `flowtide dev up` keeps the tokens it created (under the home folder).
DEV_TOKENS = Path("dev") / "tokens.json"


def read_token_file(path: str | Path) -> str:
    """The token in a file (first non-empty line).

    Raises:
        FlowtideError: the file cannot be read or holds no token.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FlowtideError(f"cannot read the token file {path}: {exc.strerror}") from None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise FlowtideError(f"the token file {path} is empty")


def _same_server(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        return url.rstrip("/").replace("://localhost:", "://127.0.0.1:")

    return norm(a) == norm(b)


def dev_urls(doc: dict[str, object]) -> list[str]:
    """The server URLs of a dev stack's tokens file: `server_url`, and with several shards
    every shard's server (`server_urls`)."""
    urls = [str(doc.get("server_url", ""))]
    more = doc.get("server_urls")
    if isinstance(more, list):
        urls += [str(u) for u in more]
    return [u.rstrip("/") for u in urls if u]


def dev_token(server: str, home: Path | None = None) -> str | None:
    """The dev stack's admin token when `server` is that stack's URL."""
    if home is None:
        from flowtide.home import find_home
        from flowtide.settings import HomeSection, read

        home = find_home(read(HomeSection).home)
    try:
        doc = json.loads((home / DEV_TOKENS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not any(_same_server(u, server) for u in dev_urls(doc)):
        return None
    token = doc.get("admin")
    return token if isinstance(token, str) and token else None


def resolve_token(server: str, token: str | None = None) -> str | None:
    """The token to send to `server`, or None (see the module's docstring)."""
    if token:
        return token.strip()
    from flowtide.settings import ClientSection, read

    client = read(ClientSection)
    if client.token:
        return client.token
    path = client.token_file
    if path:
        return read_token_file(path)
    return dev_token(server)
