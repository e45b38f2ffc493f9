"""Credentials and the keychain: secrets the server keeps for playbooks. Their rows
live in the cluster database, so any server answers. (The catalog's routes, which
`flowtide ui` serves too, are `flowtide.web.catalog`.)

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
import time
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from pydantic import BaseModel, Field, ValidationInfo, field_validator

from flowtide.errors import CredentialError
from flowtide.redaction import weak_fields, weak_message
from flowtide.server.runtime import Runtime, RuntimeDep
from flowtide.web.catalog import parse_catalog_id
from flowtide.web.fields import INT64_MAX, PositiveId, RequestBody, Text
from flowtide.web.problems import RequestError, problem_responses

if TYPE_CHECKING:
    from flowtide.store.pgkeychain import KeychainRow

__all__ = ["router"]

_NAME: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$"
_KIND: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
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


async def _resolve(runtime: Runtime, catalog_id: str) -> tuple[str, int]:
    """(path, version) of an existing catalog entry; NotFoundError (404) naming it."""
    path, version = parse_catalog_id(catalog_id)
    row = await asyncio.to_thread(runtime.store.get_playbook, path, version)
    return row.path, row.version


router = APIRouter()


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
        raise RequestError(503, f"credential vault unavailable: {exc}") from None
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
        raise RequestError.of_field("catalog_id", str(exc)) from None
    now = time.time()
    rows = await asyncio.to_thread(lambda: runtime.store.list_keychain(path, version, now=now))
    return KeychainList(catalog_id=f"{path}@{version}", items=[_keychain_doc(r, now) for r in rows])


async def _locate(
    runtime: Runtime, catalog_id: str, scope: str, execution_id: int | None
) -> tuple[str, int]:
    """(path, version) of the catalog entry a keychain route names; a 422 naming the
    field for a scope without its owner (or with one it cannot have) or a bad id."""
    problem = _scope_problem(scope, execution_id)
    if problem:
        raise RequestError.of_field("execution_id", problem)
    try:
        return await _resolve(runtime, catalog_id)
    except ValueError as exc:
        raise RequestError.of_field("catalog_id", str(exc)) from None


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
    path, version = await _locate(runtime, catalog_id, body.scope, body.execution_id)
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
        raise RequestError(503, f"credential vault unavailable: {exc}") from None
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
    path, version = await _locate(runtime, catalog_id, scope, execution_id)
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
    path, version = await _locate(runtime, catalog_id, scope, execution_id)
    now = time.time()
    await asyncio.to_thread(
        lambda: runtime.store.delete_keychain(
            path, version, name, scope=scope, execution_id=execution_id, now=now
        )
    )
    return Deleted(name=name)
