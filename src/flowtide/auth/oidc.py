"""Bearer JWTs from an organisation's identity provider (single sign-on).

The server verifies a JWT's signature against the provider's JWKS (fetched from
`--jwks-url` and cached; PyJWT's PyJWKClient), its expiry, and, when configured, its
issuer and audience; then maps claims to a flowtide role:

* `--jwt-roles-claim` (default `flowtide_roles`) names a claim holding a string or a list
  of strings (for example `groups`);
* each `--jwt-role VALUE=ROLE` maps one of those strings to a role; without any, the
  strings must be role names themselves (`reader`, `operator`, `admin`, `worker`);
* the caller gets the most powerful role mapped (admin > operator > reader; `worker`
  only when no person's role is mapped); nothing mapped is a 403;
* a worker's pool comes from `--jwt-pool-claim` (default `flowtide_pool`), any pool when
  the claim is absent.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from flowtide.auth.principal import Principal
from flowtide.auth.tokens import ROLES, check_fields
from flowtide.errors import AuthError, FlowtideError

__all__ = ["JwtSettings", "JwtVerifier", "jwt_expiry", "looks_like_jwt", "parse_role_map"]

_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
_PEOPLE: Final = ("admin", "operator", "reader")


def looks_like_jwt(text: str) -> bool:
    return text.count(".") == 2 and not text.startswith("ftk_")


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT already verified (None when it cannot be read): a
    session opened with it ends when it would have."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims["exp"]
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def parse_role_map(items: list[str] | str | None) -> dict[str, str]:
    """`["group-a=admin", "group-b=reader"]` (or the same comma-separated) as a dict.

    Raises:
        FlowtideError: an item is not VALUE=ROLE with a known role.
    """
    if not items:
        return {}
    if isinstance(items, str):
        items = [i for i in items.split(",") if i.strip()]
    out: dict[str, str] = {}
    for item in items:
        value, sep, role = item.rpartition("=")
        value, role = value.strip(), role.strip()
        if not sep or not value:
            raise FlowtideError(f"--jwt-role: {item!r} is not VALUE=ROLE")
        if role not in ROLES:
            raise FlowtideError(f"--jwt-role: {item!r}: {role!r} is not one of {', '.join(ROLES)}")
        out[value] = role
    return out


@dataclass(frozen=True)
class JwtSettings:
    jwks_url: str
    issuer: str | None = None
    audience: str | None = None
    roles_claim: str = "flowtide_roles"
    role_map: Mapping[str, str] = field(default_factory=dict)
    pool_claim: str = "flowtide_pool"
    #: Seconds of clock skew allowed on exp / nbf / iat.
    leeway: float = 30.0


class JwtVerifier:
    """Checks bearer JWTs. `verify` blocks (it may fetch the JWKS): call it in a thread."""

    def __init__(self, settings: JwtSettings) -> None:
        import jwt

        self.settings = settings
        self._jwt = jwt
        # Keys are cached; an unknown `kid` (the provider rotated its keys) refetches.
        self._keys = jwt.PyJWKClient(settings.jwks_url, cache_keys=True, lifespan=300, timeout=5)

    def verify(self, token: str) -> Principal:
        """The principal a valid JWT maps to.

        Raises:
            AuthError: 401 for a token that does not verify; 403 for one whose claims map
                to no role (or to a pool name that is not one).
        """
        jwt = self._jwt
        s = self.settings
        try:
            key = self._keys.get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=list(_ALGORITHMS),
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway,
                options={"require": ["exp", "sub"], "verify_aud": s.audience is not None},
            )
        except jwt.PyJWKClientConnectionError as exc:
            # The provider is unreachable: not the caller's fault, but nothing verifies.
            raise AuthError(
                f"cannot fetch the JWKS to verify the token: {exc}", status=401
            ) from None
        except (jwt.PyJWTError, jwt.PyJWKClientError, ValueError) as exc:
            raise AuthError(f"invalid token: {exc}", status=401) from None
        role = self._role(claims.get(s.roles_claim))
        pool = claims.get(s.pool_claim) if role == "worker" else None
        try:
            check_fields(role, pool if isinstance(pool, str) else None, None)
        except FlowtideError as exc:
            raise AuthError(f"token claims: {exc}", status=403) from None
        if pool is not None and not isinstance(pool, str):
            raise AuthError(f"token claim {s.pool_claim!r} is not a pool name", status=403)
        sub = str(claims["sub"])
        name = str(claims.get("preferred_username") or claims.get("email") or sub)
        return Principal(f"jwt:{claims.get('iss', '')}:{sub}", name, role, pool)

    def _role(self, value: Any) -> str:
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        role_map = self.settings.role_map
        roles = {
            (role_map.get(v) if role_map else (v if v in ROLES else None))
            for v in values
            if isinstance(v, str)
        } - {None}
        for role in _PEOPLE:
            if role in roles:
                return role
        if "worker" in roles:
            return "worker"
        raise AuthError(
            f"the token's claim {self.settings.roles_claim!r} maps to no flowtide role",
            status=403,
        )
