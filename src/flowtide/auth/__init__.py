"""Who is calling: API tokens, JWTs from an identity provider, and the roles they carry.

The server checks every request with `flowtide.web.access` (authentication, then the
route's rule); this package holds what the server and the command line share.
"""

from flowtide.auth.principal import Principal
from flowtide.auth.tokens import ROLES

__all__ = ["ROLES", "Principal"]
