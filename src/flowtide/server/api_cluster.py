"""The cluster-scoped endpoints of the API: the playbook catalog, credentials and the
keychain. Their rows live in the cluster database, so any server answers.

Secrets cross the API in plaintext one way only: into the server, which encrypts them with
its vault (the master key in FLOWTIDE_MASTER_KEY or <FLOWTIDE_HOME>/master.key) before
they reach the database. Nothing returns them decrypted: reads give metadata, and with
`?ciphertext=true` the Fernet token, which a worker decrypts with the same master key
(`flowtide.worker`). Error messages name aliases, never values.

A catalog id is `path@version`, or `path` for the latest version (as in POST
/api/execute); the keychain stores entries under the exact version it resolves to, so a
new version of a playbook starts with an empty keychain (NoETL keys it by catalog_id too).
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationInfo, field_validator

from flowtide.errors import CredentialError, PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import weak_fields, weak_message
from flowtide.server.fields import INT64_MAX, PositiveId, RequestBody, Text
from flowtide.server.problems import error_response, field_error, problem_responses
from flowtide.server.runtime import Runtime, RuntimeDep
from flowtide.store.base import catalog_path_problem
from flowtide.ui.details import check_playbook

if TYPE_CHECKING:
    from flowtide.playbook.model import Playbook
    from flowtide.server.schemas import ExecuteRequest
    from flowtide.store.base import Store
    from flowtide.store.postgres import KeychainRow

__all__ = [
    "catalog_entry",
    "catalog_list",
    "parse_catalog_id",
    "register_text",
    "requested_playbook",
    "router",
    "validate_text",
]

_NAME: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$"
_KIND: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
_CATALOG_VERSION: Final = re.compile(r"(.+)@([0-9]{1,10})", re.ASCII)
_MAX_VERSION: Final = 2**31 - 1  # catalog.version is a PostgreSQL integer
_PER_EXECUTION: Final = ("local", "shared")
_MAX_TTL: Final = 10 * 365 * 86400
_MAX_EXPIRES: Final = 253402300799  # 9999-12-31T23:59:59Z
Scope = Literal["global", "catalog", "local", "shared"]


# Annotations of path and query parameters (module level: FastAPI resolves them by name).
CatalogIdParam = Annotated[Text, PathParam(min_length=1, max_length=4096)]
ScopeQuery = Annotated[Scope, Query(description="The entry's scope.")]
OwnerQuery = Annotated[
    int | None,
    Query(ge=1, le=INT64_MAX, description="Owning execution (local/shared scope)."),
]
NameParam = Annotated[str, PathParam(pattern=_NAME)]


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


# -- bodies and documents --------------------------------------------------------------


class RegisterRequest(RequestBody):
    content: str = Field(
        min_length=1, max_length=4_000_000, description="The playbook's YAML text."
    )
    source_file: Text | None = Field(
        None,
        max_length=4096,
        description="File the text came from: named in error messages and recorded.",
    )


class Registered(BaseModel):
    path: str
    version: int
    catalog_id: str = Field(description="`path@version`, for POST /api/execute.")


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


class CredentialRequest(RequestBody):
    name: str = Field(pattern=_NAME, description="Alias used by playbooks (`auth: NAME`).")
    kind: str = Field("generic", pattern=_KIND, description="postgres, http, ...")
    data: dict[str, Any] = Field(
        min_length=1,
        description="The secret body (host, user, password, token...): encrypted by the "
        "server and never returned.",
    )


class CredentialInfo(BaseModel):
    name: str
    kind: str
    created: float
    updated: float


class SealedCredential(CredentialInfo):
    ciphertext: str = Field(description="Base64 of the Fernet token of the body.")


class StoredCredential(CredentialInfo):
    warnings: list[str] = Field(
        default_factory=list,
        description="Secret fields too short or too common to be masked safely in output "
        "(named, never shown).",
    )


class Deleted(BaseModel):
    name: str
    deleted: bool = True


class KeychainRequest(RequestBody):
    data: dict[str, Any] = Field(
        min_length=1,
        description="The secret or token (e.g. {access_token, token_type}): encrypted by "
        "the server and never returned.",
    )
    kind: str = Field("token", pattern=_KIND, description="token, oauth2, secret, ...")
    scope: Scope = Field(
        "global",
        description="global/catalog: shared by every execution of the catalog entry; "
        "local/shared: owned by `execution_id` (and its children).",
    )
    execution_id: PositiveId | None = Field(
        None,
        validate_default=True,
        description="The owning execution: required for local/shared scope, else absent.",
    )
    ttl_seconds: float | None = Field(
        None,
        gt=0,
        le=_MAX_TTL,
        allow_inf_nan=False,
        description="Seconds until the entry expires (default: never).",
    )
    expires_at: float | None = Field(
        None,
        gt=0,
        le=_MAX_EXPIRES,
        allow_inf_nan=False,
        description="Unix time the entry expires (instead of ttl_seconds).",
    )

    @field_validator("execution_id")
    @classmethod
    def _owner(cls, value: int | None, info: ValidationInfo) -> int | None:
        scope = info.data.get("scope")
        if scope is None:
            return value  # the scope itself is invalid and reported
        problem = _scope_problem(scope, value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("expires_at")
    @classmethod
    def _one_expiry(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None:
            if info.data.get("ttl_seconds") is not None:
                raise ValueError("give ttl_seconds or expires_at, not both")
            if value <= time.time():
                raise ValueError("expires_at is in the past")
        return value


class KeychainEntry(BaseModel):
    catalog_id: str = Field(description="`path@version` the entry belongs to.")
    name: str
    kind: str
    scope: str
    execution_id: str | None
    expires_at: float | None
    ttl_seconds: float | None = Field(description="Seconds left (None: never expires).")
    created: float
    updated: float


class SealedKeychainEntry(KeychainEntry):
    ciphertext: str = Field(description="Base64 of the Fernet token of the data.")


class KeychainList(BaseModel):
    catalog_id: str
    items: list[KeychainEntry]


def _scope_problem(scope: str, execution_id: int | None) -> str | None:
    if scope in _PER_EXECUTION and execution_id is None:
        return f"required for scope '{scope}'"
    if scope not in _PER_EXECUTION and execution_id is not None:
        return f"only local and shared entries belong to an execution, not '{scope}' ones"
    return None


def _sealed(token: bytes) -> str:
    return base64.b64encode(token).decode("ascii")


def _keychain_doc(entry: KeychainRow, now: float) -> KeychainEntry:
    return KeychainEntry(
        catalog_id=entry.catalog_id,
        name=entry.name,
        kind=entry.kind,
        scope=entry.scope,
        execution_id=str(entry.execution_id) if entry.execution_id else None,
        expires_at=entry.expires,
        ttl_seconds=None if entry.expires is None else round(entry.expires - now, 3),
        created=entry.created,
        updated=entry.updated,
    )


def _playbook_error(exc: PlaybookError) -> JSONResponse:
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
    return error_response(400, str(exc), field="content", fields=fields)


async def _resolve(runtime: Runtime, catalog_id: str) -> tuple[str, int]:
    """(path, version) of an existing catalog entry; NotFoundError (404) naming it."""
    path, version = parse_catalog_id(catalog_id)
    row = await asyncio.to_thread(runtime.store.get_playbook, path, version)
    return row.path, row.version


async def requested_playbook(
    store: Store, body: ExecuteRequest
) -> tuple[Playbook, int | None] | JSONResponse:
    """The playbook a `POST /api/execute` names (a catalog path and version, a catalog id,
    or inline text; parsed in a thread) and its catalog version (None when inline), or
    the 400/422 reply when it names none, several, or an ill-formed catalog id.

    Raises:
        PlaybookError: the text is not a valid playbook.
        NotFoundError: no such catalog path or version (404).
    """
    given = [x for x in (body.path, body.catalog_id, body.playbook) if x]
    if len(given) != 1:
        return error_response(400, "give exactly one of path, catalog_id, playbook")
    if body.playbook:
        return await asyncio.to_thread(parse_playbook, body.playbook, None), None
    path, version = body.path or "", body.version
    if body.catalog_id:
        try:
            path, parsed = parse_catalog_id(body.catalog_id)
        except ValueError as exc:
            return error_response(422, f"catalog_id: {exc}", field="catalog_id")
        version = parsed or version
    row = await asyncio.to_thread(store.get_playbook, path, version)
    return await asyncio.to_thread(parse_playbook, row.text, row.source_file), row.version


async def register_text(store: Store, body: RegisterRequest) -> Registered | JSONResponse:
    """Validate a playbook text and record it under its metadata.path (a new version
    when the text changed, else the latest one); a 400 naming the problems when invalid.
    The server's and `flowtide ui`'s `POST /api/catalog/register`."""
    file = body.source_file
    try:
        playbook = await asyncio.to_thread(parse_playbook, body.content, file)
    except PlaybookError as exc:
        return _playbook_error(exc)
    except RecursionError:  # the YAML parser recurses per nesting level
        return _playbook_error(PlaybookError("the YAML nests too deeply", file=file, line=1))
    path: object = playbook.path
    problem = catalog_path_problem(path)
    if problem or not isinstance(path, str):
        return _playbook_error(
            PlaybookError(
                problem or "metadata.path is not text",
                file=file,
                field="metadata.path",
                expected="the catalog path to record, a string",
            )
        )
    version = await asyncio.to_thread(
        lambda: store.register_playbook(path, playbook.text, source_file=file, created=time.time())
    )
    return Registered(path=path, version=version, catalog_id=f"{path}@{version}")


async def catalog_list(store: Store, path: str | None) -> CatalogList:
    """The latest version of every registered path starting with `path`."""
    rows = await asyncio.to_thread(store.catalog_entries, path)
    return CatalogList(
        items=[CatalogEntry(**r, catalog_id=f"{r['path']}@{r['version']}") for r in rows]
    )


async def catalog_entry(store: Store, path: str, version: int | None) -> CatalogPlaybook:
    """One registered playbook with its text, workload defaults and, if the text no
    longer validates, why. Raises NotFoundError (404) naming the path."""
    row = await asyncio.to_thread(store.get_playbook, path, version)
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
        errors=check["errors"],
    )


async def validate_text(body: RegisterRequest) -> PlaybookCheck:
    """`POST /api/catalog/validate` (on a server and in `flowtide ui`)."""
    return PlaybookCheck(**await asyncio.to_thread(check_playbook, body.content, body.source_file))


PathPrefix = Annotated[
    Text | None, Query(max_length=4096, description="Only paths starting with this.")
]
CatalogVersion = Annotated[
    int | None, Query(ge=1, le=_MAX_VERSION, description="Default: the latest.")
]

router = APIRouter()


# -- catalog ------------------------------------------------------------------------


@router.post(
    "/api/catalog/register",
    status_code=201,
    tags=["catalog"],
    responses=problem_responses((400, "Invalid playbook: file:line:column and field.")),
)
async def register_playbook(body: RegisterRequest, runtime: RuntimeDep) -> Registered:
    """Validate a playbook (as `flowtide catalog register` does) and record it under
    its metadata.path: a new version when the text changed, else the latest one."""
    return await register_text(runtime.store, body)  # type: ignore[return-value]


@router.post("/api/catalog/validate", tags=["catalog"])
async def validate_playbook(body: RegisterRequest) -> PlaybookCheck:
    """Check a playbook text as `register` would, without recording it: its name, path,
    workload defaults and step count when valid, else every error found with its line
    and column (for the UI's editor)."""
    return await validate_text(body)


@router.get("/api/catalog/list", tags=["catalog"])
async def list_catalog(runtime: RuntimeDep, path: PathPrefix = None) -> CatalogList:
    """The latest version of every registered path (no playbook text)."""
    return await catalog_list(runtime.store, path)


@router.get(
    "/api/catalog/{path:path}",
    tags=["catalog"],
    responses=problem_responses((404, "No such path or version.")),
)
async def get_catalog_entry(
    path: Annotated[Text, PathParam(max_length=4096)],
    runtime: RuntimeDep,
    version: CatalogVersion = None,
) -> CatalogPlaybook:
    """One registered playbook: metadata, its YAML text, its workload defaults (what a
    run form offers) and, if the text no longer validates, why. 404 names the path."""
    return await catalog_entry(runtime.store, path, version)


# -- credentials --------------------------------------------------------------------


@router.post(
    "/api/credentials",
    status_code=201,
    tags=["credentials"],
    responses=problem_responses((503, "The credential vault is unavailable (master key).")),
)
async def put_credential(body: CredentialRequest, runtime: RuntimeDep) -> StoredCredential:
    """Store (or replace) a credential alias; the server encrypts `data`. `warnings`
    names the secret fields whose values are too weak to be masked safely."""

    def write() -> dict[str, Any]:
        runtime.vault().set(body.name, body.data, kind=body.kind)
        return dict(runtime.store.credential_info(body.name))

    try:
        info = await asyncio.to_thread(write)
    except CredentialError as exc:  # the master key is unusable: the server's fault
        return error_response(503, f"credential vault unavailable: {exc}")  # type: ignore[return-value]
    warnings = [weak_message(body.name, f, why) for f, why in weak_fields(body.data)]
    return StoredCredential(**info, warnings=warnings)


@router.get("/api/credentials", tags=["credentials"])
async def list_credentials(runtime: RuntimeDep) -> list[CredentialInfo]:
    """Every alias with its kind and times; never a value."""
    rows = await asyncio.to_thread(runtime.store.list_credentials)
    return [CredentialInfo(**r) for r in rows]


@router.get(
    "/api/credentials/{name}",
    tags=["credentials"],
    responses=problem_responses((404, "No such credential.")),
)
async def get_credential(
    name: Annotated[Text, PathParam(min_length=1, max_length=200)],
    runtime: RuntimeDep,
    ciphertext: Annotated[
        bool, Query(description="Include the Fernet token (for workers).")
    ] = False,
) -> SealedCredential | CredentialInfo:
    """A credential's metadata; with ?ciphertext=true also its encrypted body, which
    only holders of the master key can read."""

    def read() -> SealedCredential | CredentialInfo:
        info = runtime.store.credential_info(name)
        if not ciphertext:
            return CredentialInfo(**info)
        _kind, token = runtime.store.get_credential(name)
        return SealedCredential(**info, ciphertext=_sealed(token))

    return await asyncio.to_thread(read)


@router.delete(
    "/api/credentials/{name}",
    tags=["credentials"],
    responses=problem_responses((404, "No such credential.")),
)
async def delete_credential(
    name: Annotated[Text, PathParam(min_length=1, max_length=200)],
    runtime: RuntimeDep,
) -> Deleted:
    await asyncio.to_thread(runtime.store.delete_credential, name)
    return Deleted(name=name)


# -- keychain -----------------------------------------------------------------------


@router.get(
    "/api/keychain",
    tags=["keychain"],
    responses=problem_responses((404, "No such catalog entry.")),
)
async def list_keychain(
    catalog_id: Annotated[Text, Query(min_length=1, max_length=4096)],
    runtime: RuntimeDep,
) -> KeychainList:
    """The live (unexpired) entries of a catalog entry, metadata only."""
    try:
        path, version = await _resolve(runtime, catalog_id)
    except ValueError as exc:
        return field_error("catalog_id", str(exc))  # type: ignore[return-value]
    now = time.time()
    rows = await asyncio.to_thread(lambda: runtime.store.list_keychain(path, version, now=now))
    return KeychainList(catalog_id=f"{path}@{version}", items=[_keychain_doc(r, now) for r in rows])


async def _locate(
    runtime: Runtime, catalog_id: str, scope: str, execution_id: int | None
) -> tuple[str, int] | JSONResponse:
    problem = _scope_problem(scope, execution_id)
    if problem:
        return field_error("execution_id", problem)
    try:
        return await _resolve(runtime, catalog_id)
    except ValueError as exc:
        return field_error("catalog_id", str(exc))


@router.post(
    "/api/keychain/{catalog_id:path}/{name}",
    tags=["keychain"],
    responses=problem_responses(
        (404, "No such catalog entry."),
        (503, "The credential vault is unavailable (master key)."),
    ),
)
async def put_keychain(
    catalog_id: CatalogIdParam, name: NameParam, body: KeychainRequest, runtime: RuntimeDep
) -> KeychainEntry:
    """Cache a secret or token for a catalog entry (replacing the entry of the same
    name, scope and execution), encrypted; with an expiry when given."""
    where = await _locate(runtime, catalog_id, body.scope, body.execution_id)
    if isinstance(where, JSONResponse):
        return where  # type: ignore[return-value]
    path, version = where
    now = time.time()
    expires = body.expires_at
    if body.ttl_seconds is not None:
        expires = now + body.ttl_seconds

    def write() -> KeychainRow:
        return runtime.store.put_keychain(  # type: ignore[no-any-return]
            path,
            version,
            name,
            scope=body.scope,
            execution_id=body.execution_id,
            kind=body.kind,
            ciphertext=runtime.vault().seal(body.data),
            expires=expires,
            now=now,
        )

    try:
        entry = await asyncio.to_thread(write)
    except CredentialError as exc:
        return error_response(503, f"credential vault unavailable: {exc}")  # type: ignore[return-value]
    return _keychain_doc(entry, now)


@router.get(
    "/api/keychain/{catalog_id:path}/{name}",
    tags=["keychain"],
    responses=problem_responses((404, "No such catalog entry, or no live keychain entry.")),
)
async def get_keychain(
    catalog_id: CatalogIdParam,
    name: NameParam,
    runtime: RuntimeDep,
    scope: ScopeQuery = "global",
    execution_id: OwnerQuery = None,
    ciphertext: Annotated[
        bool, Query(description="Include the Fernet token (for workers).")
    ] = False,
) -> SealedKeychainEntry | KeychainEntry:
    """A keychain entry's metadata (and with ?ciphertext=true its encrypted body);
    404 when the catalog entry or the keychain entry is unknown or has expired."""
    where = await _locate(runtime, catalog_id, scope, execution_id)
    if isinstance(where, JSONResponse):
        return where  # type: ignore[return-value]
    path, version = where
    now = time.time()
    entry = await asyncio.to_thread(
        lambda: runtime.store.get_keychain(
            path, version, name, scope=scope, execution_id=execution_id, now=now
        )
    )
    doc = _keychain_doc(entry, now)
    if ciphertext:
        return SealedKeychainEntry(**doc.model_dump(), ciphertext=_sealed(entry.ciphertext))
    return doc


@router.delete(
    "/api/keychain/{catalog_id:path}/{name}",
    tags=["keychain"],
    responses=problem_responses((404, "No such catalog entry, or no live keychain entry.")),
)
async def delete_keychain(
    catalog_id: CatalogIdParam,
    name: NameParam,
    runtime: RuntimeDep,
    scope: ScopeQuery = "global",
    execution_id: OwnerQuery = None,
) -> Deleted:
    """Remove a keychain entry (404 when unknown or already expired)."""
    where = await _locate(runtime, catalog_id, scope, execution_id)
    if isinstance(where, JSONResponse):
        return where  # type: ignore[return-value]
    path, version = where
    now = time.time()
    await asyncio.to_thread(
        lambda: runtime.store.delete_keychain(
            path, version, name, scope=scope, execution_id=execution_id, now=now
        )
    )
    return Deleted(name=name)
