"""Which files the tools that run inside this process may touch.

`python` and `shell` steps run in child processes, as `--python-user` when the worker is
root. `duckdb`, `transfer` (its file ends), `artifact` (local paths) and the script files
of `postgres`/`python`/`script` steps are read and written by this process itself, with
its user's rights: on a worker, that process holds the worker's token and NATS password
(`/proc/self/environ`), its TLS key and, on a dev stack, the stack's passwords under the
flowtide home. A playbook must not read those through a DuckDB query or a transfer's
`path`.

So a worker confines those tools to **file roots**: its working directory and its data
folder by default (`--file-root DIR`, repeatable; `FLOWTIDE_FILE_ROOTS`, `os.pathsep`
separated), minus **private** folders that no step may reach even inside a root: the
flowtide home, but for its data folder (results by reference live there), which is a
root of its own. A path is checked after symbolic links are resolved, so a link inside a
root that points out of it leads nowhere. DuckDB enforces the same set itself
(`enable_external_access = false`, `allowed_directories`, `allowed_paths`,
`lock_configuration`), so `read_text('/proc/self/environ')` in a query fails inside
DuckDB. `--file-root '*'` turns confinement off, as embedded runs are: `flowtide run` is
the user's own process, with the user's own files.

Not covered: a `spark` step (and a `transfer` with `engine: spark`) in local mode runs a
JVM in the worker that reads what the worker's user may read; on workers that run
playbooks you do not trust, run Spark steps through Spark Connect or a cluster.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from flowtide.errors import ToolError

ENV_ROOTS = "FLOWTIDE_FILE_ROOTS"
ANY = "*"

# fsspec protocols that name storage outside this machine; any other (file, local,
# memory, chained `a::b` URLs...) would reach the local file system around the check.
REMOTE_PROTOCOLS = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf"}
)


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


@dataclass(frozen=True)
class FileAccess:
    """`roots`: folders whose files the tools may use (None: any file). `private`:
    folders never reachable, but through a root inside them (the home's data folder)."""

    roots: tuple[Path, ...] | None = None
    private: tuple[Path, ...] = ()

    @classmethod
    def confined(
        cls, roots: Iterable[Path | str], *, private: Iterable[Path | str] = ()
    ) -> FileAccess:
        return cls(tuple(_real(r) for r in roots), tuple(_real(p) for p in private))

    @classmethod
    def for_worker(
        cls, roots: Sequence[str], *, home: Path, data_dir: Path, cwd: Path | None = None
    ) -> FileAccess:
        """The worker's setting: `roots` as given (`*` alone: unconfined; none: the
        working directory), plus `data_dir`; the home always private.

        Raises:
            ToolError: `*` given with folders.
        """
        if list(roots) == [ANY]:
            return cls()
        if ANY in roots:
            raise ToolError(f"--file-root {ANY!r} cannot be combined with folders")
        chosen = list(roots) or [str(cwd or Path.cwd())]
        for root in chosen:
            if _real(root) == Path("/"):
                raise ToolError(
                    "a file root of / would give steps every file of this machine"
                    + ("" if roots else " (the working directory is /)")
                    + ": start the worker in its own folder, or name folders with"
                    f" --file-root ({ENV_ROOTS}), or '*' for no confinement"
                )
        return cls.confined([*chosen, data_dir], private=[home])

    @property
    def unconfined(self) -> bool:
        return self.roots is None

    def allows(self, path: Path | str) -> bool:
        """Whether `path` (links resolved) is under a root and in no private folder
        that is not itself inside that root."""
        if self.roots is None:
            return True
        real = _real(path)
        for root in self.roots:
            if _under(real, root) and all(_under(root, p) for p in self.private if _under(real, p)):
                return True
        return False

    def check(self, path: Path | str, *, what: str) -> Path:
        """`path` itself when the tools may use it.

        Raises:
            ToolError: kind "permission", naming `what` (e.g. "transfer source `path`")
            and the roots.
        """
        if self.allows(path):
            return Path(path)
        raise ToolError(
            f"{what} {str(path)!r} is outside the folders this worker's steps may use"
            f" ({self.describe()}; the worker's --file-root option)",
            kind="permission",
        )

    def check_url(self, url: str, *, what: str) -> None:
        """An fsspec URL: only remote object stores, when confined.

        Raises:
            ToolError: kind "permission".
        """
        if self.roots is None:
            return
        protocol = url.split("://", 1)[0].lower() if "://" in url else ""
        if "::" in url or protocol not in REMOTE_PROTOCOLS:
            raise ToolError(
                f"{what} {url!r}: on this worker a location is a file under"
                f" {self.describe()} or a remote store"
                f" ({', '.join(sorted(REMOTE_PROTOCOLS))})",
                kind="permission",
            )

    def describe(self) -> str:
        if self.roots is None:
            return "any folder"
        return ", ".join(str(r) for r in self.roots)

    def duckdb_allowed(self) -> tuple[list[str], list[str]]:
        """(allowed_directories, allowed_paths) for DuckDB: the roots with every private
        folder cut out. A folder holding a private folder is replaced by its entries
        (folders as directories, files as single paths, as they are now), down to the
        private folder, which is left out; roots inside a private folder stay whole."""
        if self.roots is None:
            raise ValueError("unconfined: DuckDB needs no allowed set")
        directories: list[str] = []
        files: list[str] = []

        def add(folder: Path) -> None:
            if any(_under(folder, p) for p in self.private):
                return
            if not any(_under(p, folder) for p in self.private):
                directories.append(str(folder).rstrip("/") + "/")
                return
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                return
            for entry in entries:
                if entry.is_symlink():
                    continue  # a link may lead anywhere; DuckDB would follow it
                if entry.is_dir():
                    add(entry)
                elif entry.is_file():
                    files.append(str(entry))

        for root in self.roots:
            if any(_under(root, p) for p in self.private):
                directories.append(str(root).rstrip("/") + "/")
            else:
                add(root)
        return directories, files


_lock = threading.Lock()
_current = FileAccess()


def configure(access: FileAccess) -> None:
    """Use `access` for every tool of this process from now on (the worker, at start)."""
    global _current
    with _lock:
        _current = access


def current() -> FileAccess:
    return _current


def check(path: Path | str, *, what: str) -> Path:
    """`current().check`: what tools call before they open a file."""
    return _current.check(path, what=what)


def roots_from_env() -> list[str]:
    """FLOWTIDE_FILE_ROOTS as a list (`os.pathsep` separated)."""
    from flowtide.settings import HomeSection, read

    raw = read(HomeSection).file_roots or ""
    return [p for p in raw.split(os.pathsep) if p.strip()]
