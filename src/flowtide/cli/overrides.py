"""`--set`/`--payload` keys against the playbook's workload: a key the workload does not
declare is refused (with the closest declared one), unless `--allow-extra`.

The rule is the command line's: a typo there (`--set coutn=5`) would otherwise run the
playbook with its default and say nothing. The server's `/api/execute` takes the payload
as given, as NoETL does (callers pass extra keys that templates read as `workload.x`).
Only top-level keys are checked: a declared mapping may take any keys below it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from flowtide.errors import PlaybookError
from flowtide.tools.spec import did_you_mean

AllowExtraOpt = Annotated[
    bool,
    typer.Option(
        "--allow-extra",
        help="Pass --set/--payload keys the playbook's workload does not declare.",
    ),
]


def undeclared(workload: Mapping[str, Any], overrides: Mapping[str, Any]) -> list[str]:
    """One line per key of `overrides` that `workload` does not declare, with the
    declared key it may have meant."""
    out = []
    for key in overrides:
        if key not in workload:
            hint = did_you_mean(str(key), workload).removeprefix("; ")
            out.append(f"'{key}'" + (f" ({hint})" if hint else ""))
    return out


def refuse_undeclared(
    workload: Mapping[str, Any], overrides: Mapping[str, Any], file: str | None
) -> None:
    """Raise when `overrides` has keys `workload` does not declare.

    Raises:
        PlaybookError: naming each such key and the declared ones.
    """
    extra = undeclared(workload, overrides)
    if not extra:
        return
    declared = ", ".join(map(str, workload))
    known = f"it declares {declared}" if declared else "it declares no keys"
    raise PlaybookError(
        f"--set/--payload key(s) the workload does not declare: {', '.join(extra)}; "
        f"{known}. Pass --allow-extra to send them anyway.",
        file=file,
        field="workload",
    )


def refuse_undeclared_remote(
    api: Any, text: str | None, target: str, overrides: dict[str, Any]
) -> None:
    """`refuse_undeclared` for a run on a server: the workload of the file sent, or of
    the catalog entry (when the server shows it).

    Raises:
        PlaybookError: an override the workload does not declare.
    """
    from flowtide.client import ServerError
    from flowtide.errors import PlaybookError
    from flowtide.playbook.loader import parse_playbook

    if not overrides:
        return
    if text is None:
        with contextlib.suppress(ServerError):
            path, _, version = target.partition("@")
            entry = api.get_playbook(path, int(version) if version.isdigit() else None)
            text = entry.get("content")
    if text is None:
        return
    try:
        playbook = parse_playbook(text, target)
    except PlaybookError:
        return  # the server reports what is invalid
    refuse_undeclared(playbook.workload, overrides, target)
