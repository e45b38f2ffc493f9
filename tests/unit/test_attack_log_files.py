"""The embedded runtime's ring files never write through a link put in their place."""

from __future__ import annotations

from pathlib import Path

from flowtide.logfiles import FileSpool, read_live
from flowtide.logs import LogKey

KEY = LogKey(execution_id=7, command_id=11, step="talk")


def test_a_link_in_place_of_the_ring_or_its_temporary_file_is_not_followed(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    spool = FileSpool(tmp_path / "logs")
    folder = tmp_path / "logs" / "7"
    folder.mkdir(parents=True)
    (folder / "11.tmp").symlink_to(victim)
    spool.append(KEY, b"first\n", 6, 1)
    assert victim.read_text() == "precious\n"
    ring = folder / "11.log"
    assert not ring.is_symlink() and read_live(tmp_path / "logs", 7)[11].data == b"first\n"
    # The ring itself replaced by a link: the next append does not write through it.
    ring.unlink()
    ring.symlink_to(victim)
    try:
        spool.append(KEY, b"second\n", 13, 2)
    except OSError:
        pass  # refused: the step goes on (the runtime's log writer swallows it)
    assert victim.read_text() == "precious\n"
