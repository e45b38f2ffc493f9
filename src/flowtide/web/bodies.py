"""The request bodies that both apps accept (the server and `flowtide ui`): starting,
re-running and cancelling an execution, and a playbook text for the catalog. Strict, as
every body (`flowtide.web.fields.RequestBody`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from flowtide.web.fields import INT32_MAX, INTEGRAL, Id, RequestBody, Text

__all__ = ["CancelRequest", "ExecuteRequest", "RegisterRequest", "RerunRequest"]


class ExecuteRequest(RequestBody):
    path: str | None = Field(None, description="Catalog path of the playbook.")
    version: Annotated[int, Field(ge=1, le=INT32_MAX), INTEGRAL] | None = Field(
        None, description="Catalog version (default: latest)."
    )
    catalog_id: str | None = Field(None, description="`path@version` or `path`.")
    playbook: str | None = Field(None, max_length=4_000_000, description="Inline playbook YAML.")
    payload: dict[str, Any] = Field(default_factory=dict, description="Workload overrides.")
    pool: str = Field("default", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    shard: int | None = Field(
        None,
        ge=0,
        le=1023,
        description="On a cluster, the shard to run it on (default: the shards in turn;"
        " a sub-playbook runs on its parent's). Ignored by `flowtide ui`.",
    )
    parent_execution_id: Id | None = None
    parent_command_id: Id | None = None


class RerunRequest(RequestBody):
    pool: str = Field(
        "default", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Worker pool of the new run."
    )


class CancelRequest(RequestBody):
    reason: str = Field("cancelled by user", max_length=1000)


class RegisterRequest(RequestBody):
    content: str = Field(
        min_length=1, max_length=4_000_000, description="The playbook's YAML text."
    )
    source_file: Text | None = Field(
        None,
        max_length=4096,
        description="File the text came from: named in error messages and recorded.",
    )
