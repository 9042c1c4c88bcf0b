"""DeathStar's movie review app (``styx_benchmarks.deathstar:movie_app``).

``frontend.compose`` at the user runs DeathStar's compose-review call graph, 9 invocations:
``unique_id.generate`` (the review id, from ``ctx.uuid()``), ``user.user_id`` (user name → id),
``movie_id.movie_id`` (title → id), ``text.upload`` (validates the text), ``rating.upload`` (validates
the rating and adds it to the movie's running count and sum, like DeathStar's rating service), then
asynchronously ``review_storage.store`` (the review under its id), ``user_review.append`` and
``movie_review.append`` (the id in the user's and in the movie's review lists).

Functions call other operators by name, so :func:`build_movie_app` can build variants with some
functions replaced (the tests' broken app) from the same functions.
"""

from __future__ import annotations

from typing import Any

from styx_benchmarks.deathstar.common import BULK_STATE, PARTITIONS
from styx_benchmarks.graphs import FunctionTable, Overrides, build_graph
from styx_py import Abort, Context, Graph

MAX_REVIEW_CHARS = 10_000
MAX_RATING = 10


async def generate(ctx: Context) -> str:
    """A fresh review id: deterministic, so a re-run or replay of the transaction draws the same one."""
    return ctx.uuid().hex


async def user_id(ctx: Context) -> str:
    user = await ctx.get()
    if user is None:
        raise Abort(f"no user named {ctx.key}")
    return str(user["user_id"])


async def movie_id(ctx: Context) -> str:
    movie = await ctx.get()
    if movie is None:
        raise Abort(f"no movie titled {ctx.key}")
    return str(movie["movie_id"])


async def upload_text(ctx: Context, text: str) -> str:
    if not isinstance(text, str) or not 0 < len(text) <= MAX_REVIEW_CHARS:
        raise Abort(f"review text must be 1 to {MAX_REVIEW_CHARS} characters")
    return text


async def upload_rating(ctx: Context, rating: int) -> int:
    """Validate a rating and add it to this movie's running count and sum."""
    if not isinstance(rating, int) or isinstance(rating, bool) or not 0 <= rating <= MAX_RATING:
        raise Abort(f"rating must be an int in 0..{MAX_RATING}, got {rating!r}")
    totals = await ctx.get(default={"count": 0, "sum": 0})
    totals["count"] += 1
    totals["sum"] += rating
    await ctx.put(totals)
    return rating


async def store(ctx: Context, review: dict[str, Any]) -> None:
    if await ctx.get() is not None:
        raise Abort(f"review {ctx.key} already exists")
    await ctx.put(review)


async def append(ctx: Context, review_id: str) -> int:
    reviews = await ctx.get(default=[])
    reviews.append(review_id)
    await ctx.put(reviews)
    return len(reviews)


async def gather_review(ctx: Context, username: str, title: str, rating: int, text: str) -> dict[str, Any]:
    """The gathering half of compose: id, user, movie, text and rating, each from its service."""
    review_id = await ctx.call("unique_id", "generate", ctx.key)
    uid = await ctx.call("user", "user_id", username)
    mid = await ctx.call("movie_id", "movie_id", title)
    text = await ctx.call("text", "upload", review_id, text)
    rating = await ctx.call("rating", "upload", mid, rating)
    return {
        "review_id": review_id,
        "user_id": uid,
        "movie_id": mid,
        "text": text,
        "rating": rating,
        "timestamp_ms": round(ctx.now() * 1000),
    }


async def compose(ctx: Context, username: str, title: str, rating: int, text: str) -> str:
    """DeathStar's compose-review: gather the parts, then store the review and index it twice."""
    review = await gather_review(ctx, username, title, rating, text)
    ctx.call_async("review_storage", "store", review["review_id"], review)
    ctx.call_async("user_review", "append", review["user_id"], review["review_id"])
    ctx.call_async("movie_review", "append", review["movie_id"], review["review_id"])
    return str(review["review_id"])


# Operator -> its functions (name -> (function, read-only)), in graph order.
FUNCTIONS: dict[str, FunctionTable] = {
    "frontend": {"compose": (compose, False)},
    "unique_id": {"generate": (generate, True)},
    "user": {**BULK_STATE, "user_id": (user_id, True)},
    "movie_id": {**BULK_STATE, "movie_id": (movie_id, True)},
    "text": {"upload": (upload_text, True)},
    "rating": {**BULK_STATE, "upload": (upload_rating, False)},
    "review_storage": {**BULK_STATE, "store": (store, False)},
    "user_review": {**BULK_STATE, "append": (append, False)},
    "movie_review": {**BULK_STATE, "append": (append, False)},
}


def build_movie_app(name: str = "deathstar-movie", overrides: Overrides | None = None) -> Graph:
    """The movie review graph; ``overrides`` replaces functions by (operator, function) (tests)."""
    return build_graph(name, ((op, PARTITIONS, fns) for op, fns in FUNCTIONS.items()), overrides)


movie_app = build_movie_app()
