"""Session-wide real dependencies: a PostgreSQL server (initdb/pg_ctl on loopback) and the
HTTP stubs the NoETL fixtures need. Each is started once per test session, on demand."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pgserver import PgServer  # noqa: E402

# A shell without job control starts background commands with SIGINT ignored, and a
# program started with SIGINT ignored keeps it so: the Ctrl-C tests' children would then
# never see their SIGINT. A Python handler here becomes the default action in every
# child this session starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
NOETL_E2E = Path(os.environ.get("FLOWTIDE_NOETL_E2E", SHARED / "noetl-e2e"))


@pytest.fixture(autouse=True)
def _own_user_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command run with no home and no .flowtide folder above it keeps its state in
    the user's own home (flowtide.home.user_home): each test gets one of its own, so
    that tests never share runs nor write into the real ~/.local/share."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


@pytest.fixture(autouse=True)
def _settings_read_afresh() -> Iterator[None]:
    """Each test reads the settings tree from its own environment (flowtide.settings
    keeps what a process read; a test's monkeypatch.setenv must reach it), and finds its
    home afresh (a command run in-process with `--home` makes it the process's)."""
    from flowtide import home, settings

    settings.reset()
    home.choose(None)
    yield
    settings.reset()
    home.choose(None)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder any user may enter and read, for the files a step's program reads: steps
    run as another user (`nobody`) when the tests run as root, and then `tmp_path` (under
    /tmp/pytest-of-root, 0700) is out of their reach. A step that writes gets a subfolder
    made writable for it (`pyuser.writable`)."""
    path = Path(tempfile.mkdtemp(prefix="ft-open-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up: {last}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()


_databases = itertools.count()


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[str]:
    """A fresh empty database on the session's server for one test (its DSN); dropped
    afterwards."""
    name = f"t{next(_databases)}_{os.getpid()}"
    dsn = pg_server.create_database(name)
    try:
        yield dsn
    finally:
        pg_server.drop_database(name)


def _serve(app_dir: Path, module: str, port: int) -> subprocess.Popen[bytes]:
    """Run `module:app` with uvicorn on 127.0.0.1:port in a child process."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            f"{module}:app",
            "--app-dir",
            str(app_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def paginated_api() -> Iterator[str]:
    """NoETL's own stub server (servers/paginated_api.py), unchanged, on loopback."""
    port = free_port()
    proc = _serve(NOETL_E2E / "servers", "paginated_api", port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def posts_api() -> Iterator[str]:
    """A jsonplaceholder stand-in: GET /posts -> 100 posts."""
    port = free_port()
    proc = _serve(Path(__file__).resolve().parent / "stubs", "posts_api", port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/posts")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


#: The longest test files (CI durations, about 100-400 s each), run first: with
#: `--dist loadscope` each file goes to one xdist worker whole, in collection order, and
#: one of these collected last (tests/spark/ sorts late) left the other worker idle for
#: minutes at the end of the suite.
_LONGEST_FIRST = (
    "e2e/test_noetl_fixtures.py",
    "spark/test_spark_masters.py",
    "distributed/test_faults_matrix.py",
    "spark/test_spark_loop.py",
    "distributed/test_spark_loop.py",
    "spark/test_spark_steps.py",
    "distributed/test_dev.py",
    "distributed/test_schemathesis.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        for i, tail in enumerate(_LONGEST_FIRST):
            if path.endswith("/tests/" + tail):
                return i
        return len(_LONGEST_FIRST)

    # Stable: each file's tests keep their order, and the rest keep theirs.
    items.sort(key=rank)
