"""The playbook catalog, served the same by both apps (the server, over the cluster
database; `flowtide ui`, over the local store): register, validate, list, read. A catalog
id is `path@version`, or `path` for the latest version (as in `POST /api/execute`,
whose playbook `requested_playbook` resolves here too)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from flowtide.documents.checks import check_playbook
from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.store.base import catalog_path_problem
from flowtide.web.bodies import ExecuteRequest, RegisterRequest
from flowtide.web.fields import INT32_MAX, Text
from flowtide.web.problems import RequestError, problem_responses
from flowtide.web.reads import ExecutionReads, reads_of

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.store.base import Store

__all__ = [
    "CatalogEntry",
    "CatalogList",
    "CatalogPlaybook",
    "PlaybookCheck",
    "Registered",
    "parse_catalog_id",
    "playbook_refused",
    "requested_playbook",
    "router",
    "sql_strict",
    "sql_refused",
]

_CATALOG_VERSION: Final = re.compile(r"(.+)@([0-9]{1,10})", re.ASCII)
_MAX_VERSION: Final = INT32_MAX  # catalog.version is a PostgreSQL integer


def parse_catalog_id(catalog_id: str) -> tuple[str, int | None]:
    """(path, version) of `path@version`; (catalog_id, None) when there is no numeric
    version suffix (the latest version of that path).

    Raises:
        ValueError: the version is 0 or beyond what the catalog can hold.
    """
    match = _CATALOG_VERSION.fullmatch(catalog_id)
    if match is None:
        return catalog_id, None
    version = int(match.group(2))
    if not 1 <= version <= _MAX_VERSION:
        raise ValueError(f"version must be between 1 and {_MAX_VERSION}, got {version}")
    return match.group(1), version


# -- documents -------------------------------------------------------------------------


class Registered(BaseModel):
    path: str
    version: int
    catalog_id: str = Field(description="`path@version`, for POST /api/execute.")
    warnings: list[str] = Field(
        default_factory=list,
        description="What `flowtide validate` warns of (keys accepted but not acted on,"
        " templates pasted into SQL text): the playbook is recorded all the same.",
    )


class CatalogEntry(BaseModel):
    path: str
    version: int = Field(description="The latest version (or the one asked for).")
    versions: int = Field(description="How many versions of the path are registered.")
    catalog_id: str
    source_file: str | None
    created: float


class CatalogList(BaseModel):
    items: list[CatalogEntry]


class CatalogPlaybook(CatalogEntry):
    content: str
    name: str | None = Field(None, description="metadata.name (null when the text is invalid).")
    workload: dict[str, Any] | None = Field(
        None, description="The playbook's workload defaults: what a run may override."
    )
    steps: int = Field(0, description="How many steps the playbook has.")
    errors: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Why the text no longer validates (as `POST /api/catalog/validate`).",
    )


class PlaybookCheck(BaseModel):
    valid: bool
    name: str | None
    path: Any = Field(description="metadata.path as written (null when invalid).")
    workload: dict[str, Any] | None
    steps: int
    errors: list[dict[str, Any]] = Field(
        description="message, line, column (1-based, null when unknown), step, field, expected."
    )


def playbook_refused(exc: PlaybookError) -> RequestError:
    """400 for an invalid playbook: the CLI's message, and each problem's place."""
    problems = exc.errors if isinstance(exc, PlaybookErrors) else [exc]
    fields = [
        {
            "field": "content",
            "message": p.render(),
            "file": p.file,
            "line": p.line,
            "column": p.column,
            "step": p.step,
            "playbook_field": p.field,
            "expected": p.expected,
        }
        for p in problems
    ]
    return RequestError(400, str(exc), field="content", fields=fields)


def sql_strict(request: Request) -> bool:
    """Whether this app refuses playbooks that paste templates into SQL text: the app's
    `state.sql_strict` when set (tests), else the server setting FLOWTIDE_SQL_STRICT
    (`flowtide server --sql-strict`; `flowtide ui` reads the same variable)."""
    held = getattr(request.app.state, "sql_strict", None)
    if held is not None:
        return bool(held)
    from flowtide.settings import ServerSection, current

    return current(ServerSection).sql_strict


def sql_refused(playbook: Playbook, file: str | None) -> RequestError | None:
    """400 for a playbook that pastes templates into SQL text (the `validate --strict`
    messages, each with its file, line, step and field), None when it pastes none."""
    from flowtide.playbook.sqllint import lint_playbook

    warnings = lint_playbook(playbook, file)
    if not warnings:
        return None
    fields = [
        {
            "field": "content",
            "message": w.render("error"),
            "file": w.file,
            "line": w.line,
            "step": w.step,
            "playbook_field": w.field,
            "position": w.position,
        }
        for w in warnings
    ]
    first = warnings[0].render("error")
    more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
    message = f"refused: a template pasted into SQL (FLOWTIDE_SQL_STRICT): {first}{more}"
    return RequestError(400, message, field="content", fields=fields)


async def requested_playbook(store: Store, body: ExecuteRequest) -> tuple[Playbook, int | None]:
    """The playbook a `POST /api/execute` names (a catalog path and version, a catalog id,
    or inline text; parsed in a thread) and its catalog version (None when inline).

    Raises:
        RequestError: it names none or several (400), or an ill-formed catalog id (422).
        PlaybookError: the text is not a valid playbook.
        NotFoundError: no such catalog path or version (404).
    """
    named = {"path": body.path, "catalog_id": body.catalog_id, "playbook": body.playbook}
    given = [name for name, value in named.items() if value]
    if len(given) != 1:
        message = "give exactly one of path, catalog_id, playbook"
        # The field at fault: the one missing (path, the usual), or each of those given.
        fields = [{"field": f, "message": message} for f in given or ["path"]]
        raise RequestError(400, message, field=fields[0]["field"], fields=fields)
    if body.playbook:
        return await asyncio.to_thread(parse_playbook, body.playbook, None), None
    path, version = body.path or "", body.version
    if body.catalog_id:
        try:
            path, parsed = parse_catalog_id(body.catalog_id)
        except ValueError as exc:
            raise RequestError(422, f"catalog_id: {exc}", field="catalog_id") from None
        version = parsed or version
    row = await asyncio.to_thread(store.get_playbook, path, version)
    return await asyncio.to_thread(parse_playbook, row.text, row.source_file), row.version


PathPrefix = Annotated[
    Text | None, Query(max_length=4096, description="Only paths starting with this.")
]
CatalogVersion = Annotated[
    int | None, Query(ge=1, le=_MAX_VERSION, description="Default: the latest.")
]
Reads = Annotated[ExecutionReads, Depends(reads_of)]

router = APIRouter(tags=["catalog"])


@router.post(
    "/api/catalog/register",
    status_code=201,
    responses=problem_responses(
        (
            400,
            "Invalid playbook: file:line:column and field; or, with FLOWTIDE_SQL_STRICT, a"
            " template pasted into SQL text.",
        )
    ),
)
async def register_playbook(body: RegisterRequest, reads: Reads, request: Request) -> Registered:
    """Validate a playbook (as `flowtide catalog register` does) and record it under
    its metadata.path: a new version when the text changed, else the latest one."""
    file = body.source_file
    try:
        playbook = await asyncio.to_thread(parse_playbook, body.content, file)
    except PlaybookError as exc:
        raise playbook_refused(exc) from None
    except RecursionError:  # the YAML parser recurses per nesting level
        error = PlaybookError("the YAML nests too deeply", file=file, line=1)
        raise playbook_refused(error) from None
    path: object = playbook.path
    problem = catalog_path_problem(path)
    if problem or not isinstance(path, str):
        error = PlaybookError(
            problem or "metadata.path is not text",
            file=file,
            field="metadata.path",
            expected="the catalog path to record, a string",
        )
        raise playbook_refused(error)
    if sql_strict(request):
        refused = await asyncio.to_thread(sql_refused, playbook, file)
        if refused is not None:
            raise refused
    store = reads.store
    version = await asyncio.to_thread(
        lambda: store.register_playbook(path, playbook.text, source_file=file, created=time.time())
    )
    warnings = await asyncio.to_thread(_warnings, playbook, file)
    return Registered(path=path, version=version, catalog_id=f"{path}@{version}", warnings=warnings)


def _warnings(playbook: Any, file: str | None) -> list[str]:
    from flowtide.playbook.loader import warning_text
    from flowtide.playbook.sqllint import lint_playbook

    texts = [warning_text(w) for w in playbook.warnings]
    return texts + [w.render() for w in lint_playbook(playbook, file or "playbook")]


@router.post("/api/catalog/validate")
async def validate_playbook(body: RegisterRequest) -> PlaybookCheck:
    """Check a playbook text as `register` would, without recording it: its name, path,
    workload defaults and step count when valid, else every error found with its line
    and column (for the UI's editor)."""
    check = await asyncio.to_thread(check_playbook, body.content, body.source_file)
    return PlaybookCheck(
        valid=check["valid"],
        name=check["name"],
        path=check["path"],
        workload=check["workload"],
        steps=check["steps"],
        errors=[dict(e) for e in check["errors"]],
    )


@router.get("/api/catalog/list")
async def list_catalog(reads: Reads, path: PathPrefix = None) -> CatalogList:
    """The latest version of every registered path (no playbook text)."""
    rows = await asyncio.to_thread(reads.store.catalog_entries, path)
    return CatalogList(
        items=[CatalogEntry(**r, catalog_id=f"{r['path']}@{r['version']}") for r in rows]
    )


@router.get(
    "/api/catalog/{path:path}",
    responses=problem_responses((404, "No such path or version.")),
)
async def get_catalog_entry(
    path: Annotated[Text, PathParam(max_length=4096)],
    reads: Reads,
    version: CatalogVersion = None,
) -> CatalogPlaybook:
    """One registered playbook: metadata, its YAML text, its workload defaults (what a
    run form offers) and, if the text no longer validates, why. 404 names the path."""
    row = await asyncio.to_thread(reads.store.get_playbook, path, version)
    check = await asyncio.to_thread(check_playbook, row.text, row.source_file)
    return CatalogPlaybook(
        path=row.path,
        version=row.version,
        versions=row.versions,
        catalog_id=f"{row.path}@{row.version}",
        source_file=row.source_file,
        created=row.created,
        content=row.text,
        name=check["name"],
        workload=check["workload"],
        steps=check["steps"],
        errors=[dict(e) for e in check["errors"]],
    )
