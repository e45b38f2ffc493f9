"""A jsonplaceholder stand-in for the http_to_postgres_iterator fixture: GET /posts."""

from __future__ import annotations

from fastapi import FastAPI

app = FastAPI()

_WORDS = [
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
]


def _text(seed: int, n: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i * 3) % len(_WORDS)] for i in range(n))


POSTS = [
    {"userId": 1 + (i - 1) // 10, "id": i, "title": _text(i, 5), "body": _text(i + 3, 20)}
    for i in range(1, 101)
]


@app.get("/posts")
def posts() -> list[dict[str, object]]:
    return POSTS


@app.get("/posts/{post_id}")
def post(post_id: int) -> dict[str, object]:
    return POSTS[post_id - 1]
