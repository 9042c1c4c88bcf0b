"""The DeathStar apps with one injected bug each, for the tests that prove the invariant checks work.

``hotel_app``: flights take a seat without checking capacity, so reservations overbook flights (the
hotel check must report it). ``movie_app``: compose forgets to add the review to the movie's review
list (the movie check must report each such review). Everything else is the real app.
"""

from __future__ import annotations

from styx_benchmarks.deathstar import build_hotel_app, build_movie_app
from styx_benchmarks.deathstar.movie import gather_review
from styx_py import Abort, Context


async def reserve_seat_unchecked(ctx: Context, reservation_id: str) -> int:
    """Like the real ``flight.reserve``, but a full flight takes the booking anyway."""
    entity = await ctx.get()
    if entity is None:
        raise Abort(f"{ctx.operator} {ctx.key} does not exist")
    bookings: list[str] = entity["bookings"]
    bookings.append(reservation_id)  # the bug: no capacity check
    await ctx.put(entity)
    return int(entity["capacity"]) - len(bookings)


async def compose_forgetting_movie(ctx: Context, username: str, title: str, rating: int, text: str) -> str:
    """Like the real ``frontend.compose``, but the review never reaches the movie's review list."""
    review = await gather_review(ctx, username, title, rating, text)
    ctx.call_async("review_storage", "store", review["review_id"], review)
    ctx.call_async("user_review", "append", review["user_id"], review["review_id"])
    return str(review["review_id"])


hotel_app = build_hotel_app("deathstar-hotel-broken", {("flight", "reserve"): reserve_seat_unchecked})
movie_app = build_movie_app("deathstar-movie-broken", {("frontend", "compose"): compose_forgetting_movie})
