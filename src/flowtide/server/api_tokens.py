"""The API tokens endpoints (admin only, see flowtide.web.access): create, list,
revoke. A created token's text is in the creation's reply, and nowhere else, ever."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from flowtide.auth.tokens import TokenRecord, TokenStore
from flowtide.errors import FlowtideError
from flowtide.server.runtime import RuntimeDep
from flowtide.web.fields import RequestBody, Text
from flowtide.web.problems import RequestError, problem_responses

__all__ = ["router"]

#: Ten years: a token that should never expire is created without `expires_in`.
_MAX_LIFETIME = 10 * 365 * 86400


class TokenRequest(RequestBody):
    role: Literal["reader", "operator", "admin", "worker"]
    name: str | None = Field(None, min_length=1, max_length=128)
    pool: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Worker tokens only: the one pool they serve.",
    )
    expires_in: float | None = Field(
        None, gt=0, le=_MAX_LIFETIME, description="Seconds until it expires (default: never)."
    )


class TokenInfo(BaseModel):
    id: str
    name: str
    role: str
    pool: str | None
    created: float
    expires: float | None
    revoked: float | None
    last_used: float | None


class CreatedToken(TokenInfo):
    token: str = Field(description="The token itself: shown this once, stored only hashed.")


class TokenList(BaseModel):
    items: list[TokenInfo]


def _info(record: TokenRecord) -> TokenInfo:
    return TokenInfo(**record.to_dict())


router = APIRouter(tags=["tokens"])


@router.post(
    "/api/tokens",
    status_code=201,
    responses=problem_responses(
        (422, "A field is invalid, or `pool` is given for a role other than worker.")
    ),
)
async def create_token(body: TokenRequest, runtime: RuntimeDep) -> CreatedToken:
    """A new API token; its text is in this reply only."""
    try:
        text, record = await asyncio.to_thread(
            lambda: TokenStore(runtime.store).create(
                role=body.role, name=body.name, pool=body.pool, expires_in=body.expires_in
            )
        )
    except FlowtideError as exc:
        # check_fields and the name check say "field: message".
        field, _, message = str(exc).partition(": ")
        raise RequestError.of_field(field, message) from None
    return CreatedToken(**record.to_dict(), token=text)


@router.get("/api/tokens")
async def list_tokens(
    runtime: RuntimeDep,
    all: Annotated[bool, Query(description="Include revoked and expired tokens.")] = False,
) -> TokenList:
    """Tokens, newest first: never their text."""
    records = await asyncio.to_thread(lambda: TokenStore(runtime.store).list(include_inactive=all))
    return TokenList(items=[_info(r) for r in records])


@router.delete("/api/tokens/{token}", responses=problem_responses((404, "No such token.")))
async def revoke_token(
    token: Annotated[Text, Path(min_length=1, max_length=128, description="Id or name.")],
    runtime: RuntimeDep,
) -> TokenInfo:
    """Revoke a token by id or name; servers stop taking it within seconds. The web UI
    sessions it opened end with it."""
    record = await asyncio.to_thread(TokenStore(runtime.store).revoke, token)
    if runtime.auth is not None:
        runtime.auth.sessions.forget_token(record.token_id)
    return _info(record)
