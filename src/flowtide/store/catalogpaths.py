"""Which texts may be catalog keys (a playbook's metadata.path): checked where a playbook
is registered, by the CLI and the API alike."""

from __future__ import annotations

__all__ = ["catalog_path_problem"]


def catalog_path_problem(path: object) -> str | None:
    """Why `path` (a playbook's metadata.path) cannot be a catalog key, or None."""
    # The loader lets any YAML value through as metadata.path; the store keys by text.
    if not path:
        return "playbook has no metadata.path"
    if not isinstance(path, str):
        return "metadata.path is not text"
    if "\x00" in path:
        return "metadata.path must not contain NUL characters"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "metadata.path must be valid Unicode (no lone surrogates)"
    if any(part in (".", "..") for part in path.split("/")):
        # A URL with such a path (the UI's /ui/catalog/<path>) would name another one.
        return "metadata.path has a '.' or '..' segment"
    return None
