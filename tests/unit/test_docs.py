"""The documentation site: `mkdocs build --strict` passes (a broken link or a page left
out of the navigation fails it), and neither the site's pages nor the README speak of
the project's own history (issue numbers, phase names, design-record numbers) or link
outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
USER_TEXTS = [ROOT / "README.md", *PAGES]

#: Words of the builders' bookkeeping that mean nothing to a reader.
_INTERNAL = re.compile(r"\bissues? #?\d+|\bphase [A-Z]\b|\bADR-\d+|\.\./shared\b", re.IGNORECASE)
#: A Markdown link or image, an autolink, or an HTML href/src.
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|<(https?://[^>\s]+)>|(?:href|src)=\"([^\"]+)\"")


def _links(text: str) -> list[str]:
    # Code spans and blocks show commands and URLs as text, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [next(g for g in m.groups() if g) for m in _LINK.finditer(text)]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
        + ["--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = {
        p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*.html")
    }
    for page in PAGES:
        assert page.relative_to(DOCS).with_suffix(".html").as_posix() in built


@pytest.mark.parametrize("path", USER_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_internal_history(path: Path) -> None:
    found = [
        f"{path.name}:{n}: {m.group(0)}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in _INTERNAL.finditer(line)
    ]
    assert not found, found


@pytest.mark.parametrize("path", USER_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_stay_in_the_repository(path: Path) -> None:
    for link in _links(path.read_text(encoding="utf-8")):
        assert not re.match(r"[a-z][a-z0-9+.-]*:", link, re.IGNORECASE), (
            f"{path.name} links outside the repository: {link}"
        )
        target = (path.parent / link.split("#", 1)[0]).resolve()
        assert target.is_relative_to(ROOT), f"{path.name} links above the repository: {link}"
        if link.split("#", 1)[0]:
            assert target.exists(), f"{path.name} links to a missing file: {link}"


def _unclosed_fences(text: str) -> list[int]:
    """Lines of code fences left open: a fence with a language opened while another is
    open (a closing fence has none, so the first was never closed and the prose after it
    renders as code), or one still open at the end of the page."""
    found, open_at = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"\s*```(\S*)", line)
        if not fence:
            continue
        if not open_at:
            open_at = n
        elif fence.group(1):
            found.append(open_at)
            open_at = n
        else:
            open_at = 0
    return found + ([open_at] if open_at else [])


@pytest.mark.parametrize("path", USER_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_are_closed(path: Path) -> None:
    found = _unclosed_fences(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name}: code block opened at line(s) {found} is never closed"


def test_the_checks_catch_what_they_look_for() -> None:
    assert _unclosed_fences("```text\n$ x\n\n## Next\n\n```yaml\na: 1\n```\n") == [1]
    assert _unclosed_fences("```sh\nx\n```\n\n```yaml\na: 1\n") == [5]
    assert _unclosed_fences("```sh\nx\n```\n  ```yaml\n  a: 1\n  ```\n") == []
    assert _INTERNAL.search("as issue 17 lists") and _INTERNAL.search("(phase F)")
    assert _INTERNAL.search("ADR-8 semantics") and _INTERNAL.search("see ../shared/x")
    assert not _INTERNAL.search("a known issue; the phase of a run")
    assert _links("[a](https://example.org) [b](ui.md) `[c](http://x)`") == [
        "https://example.org",
        "ui.md",
    ]
