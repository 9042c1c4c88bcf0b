"""The DeathStar movie review workload (``deathstar-movie``): population, mix and invariant check.

**Mix**: compose-review only, as in DeathStarBench's ``compose-review`` script. The Styx paper's Table 1
("Deathstar Movie — 2k keys, 9-10 function calls, 0% transactions") means the baselines run it without
a transaction, while styx-py runs every request as one.

**Population** at ``Options.scale`` 1.0 (each count is scaled and rounded, at least 1): 1 000 users and
1 000 movies (the Styx authors' DeathStar port's populations, Table 1's 2k keys); password salts come
from ``Random(Options.seed)``.

**Invariant**: every stored review is complete (id, user, movie, text, rating, timestamp), appears
exactly once in its user's list and once in its movie's list, no list names a review that is not stored
or is someone else's, and each movie's rating count and sum equal those of its reviews.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from styx_benchmarks.deathstar.common import load_calls, password_hash, run_load, scaled
from styx_benchmarks.deathstar.movie import MAX_RATING
from styx_benchmarks.workload import Op, Options, Progress, State, Workload, read_many
from styx_py.core.partitioning import Key

if TYPE_CHECKING:
    from styx_client import Call, StyxClient

MOVIE_DEFAULTS = {"users": 1000, "movies": 1000}
REVIEW_CHARS = 256  # DeathStar's compose-review text length
REVIEW_FIELDS = ("review_id", "user_id", "movie_id", "text", "rating", "timestamp_ms")
CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?"


def movie_user_name(i: int) -> str:
    return f"username_{i}"


def movie_user_id(i: int) -> str:
    return f"user{i}"


def movie_key(i: int) -> str:
    return f"movie{i}"


def movie_title(i: int) -> str:
    return f"title_{i}"


class MovieReview(Workload):
    """DeathStar movie review (compose review); see the module docstrings for the data model and the mix."""

    name = "deathstar-movie"
    app = "styx_benchmarks.deathstar:movie_app"
    description = "DeathStar movie review: compose review across 9 functions"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        o = self.options
        if not o.scale > 0:
            raise ValueError(f"scale must be positive, got {o.scale}")
        self.users = scaled(MOVIE_DEFAULTS["users"], o.scale)
        self.movies = scaled(MOVIE_DEFAULTS["movies"], o.scale)

    # ---- load ------------------------------------------------------------------------------------------
    def initial_state(self) -> dict[str, list[tuple[Key, Any]]]:
        rng = random.Random(self.options.seed)
        users: list[tuple[Key, Any]] = []
        for i in range(self.users):
            salt = rng.randbytes(8).hex()
            record = {
                "user_id": movie_user_id(i),
                "username": movie_user_name(i),
                "first_name": f"first_{i}",
                "last_name": f"last_{i}",
                "salt": salt,
                "password_hash": password_hash(salt, f"password_{i}"),
            }
            users.append((movie_user_name(i), record))
        movies: list[tuple[Key, Any]] = [
            (movie_title(i), {"movie_id": movie_key(i), "title": movie_title(i)}) for i in range(self.movies)
        ]
        return {"user": users, "movie_id": movies}

    def load_calls(self) -> list[Call]:
        return load_calls(self.initial_state().items())

    async def load(self, client: StyxClient, progress: Progress = print) -> None:
        entities = sum(len(items) for items in self.initial_state().values())
        await run_load(client, self.name, self.load_calls(), entities, progress)

    # ---- run -------------------------------------------------------------------------------------------
    def next_op(self, rng: random.Random) -> Op:
        user = movie_user_name(rng.randrange(self.users))
        title = movie_title(rng.randrange(self.movies))
        rating = rng.randint(0, MAX_RATING)
        text = "".join(rng.choices(CHARSET, k=REVIEW_CHARS))
        return Op("compose", "frontend", user, "compose", (user, title, rating, text))

    # ---- check -----------------------------------------------------------------------------------------
    async def read_state(self, client: StyxClient) -> State:
        reads = [("user_review", movie_user_id(i), "read") for i in range(self.users)]
        reads += [("movie_review", movie_key(i), "read") for i in range(self.movies)]
        reads += [("rating", movie_key(i), "read") for i in range(self.movies)]
        lists = {k: v for k, v in (await read_many(client, reads)).items() if v is not None}
        review_ids = sorted(
            {rid for (op, _), v in lists.items() if op in ("user_review", "movie_review") for rid in v}
        )
        reviews = await read_many(client, (("review_storage", rid, "read") for rid in review_ids))
        return {**lists, **{k: v for k, v in reviews.items() if v is not None}}

    def check_state(self, state: State) -> list[str]:
        errors: list[str] = []
        by_operator: defaultdict[str, dict[Key, Any]] = defaultdict(dict)
        for (operator, key), value in state.items():
            by_operator[operator][key] = value
        reviews = by_operator["review_storage"]
        lists = {"user": by_operator["user_review"], "movie": by_operator["movie_review"]}
        counts = {owner: {k: Counter(v) for k, v in entries.items()} for owner, entries in lists.items()}

        stored: dict[Key, dict[str, Any]] = {}
        for rid in sorted(reviews, key=str):
            review = reviews[rid]
            problem = _review_problem(rid, review)
            if problem is not None:
                errors.append(problem)
                continue
            stored[rid] = review
            for owner in ("user", "movie"):
                holder = review[f"{owner}_id"]
                n = counts[owner].get(holder, Counter())[rid]
                if n != 1:
                    errors.append(
                        f"review {rid} appears {n} times in {owner} {holder}'s review list, expected once"
                    )

        for owner, entries in lists.items():
            for holder in sorted(entries, key=str):
                for rid in sorted(set(entries[holder]), key=str):
                    if rid not in reviews:
                        errors.append(
                            f"{owner} {holder}'s review list names review {rid}, which is not stored"
                        )
                    elif rid in stored and stored[rid][f"{owner}_id"] != holder:
                        errors.append(
                            f"{owner} {holder}'s review list names review {rid}, "
                            f"which belongs to {owner} {stored[rid][f'{owner}_id']}"
                        )

        expected: defaultdict[Key, list[int]] = defaultdict(list)
        for review in stored.values():
            expected[review["movie_id"]].append(review["rating"])
        totals = by_operator["rating"]
        for movie in sorted(set(expected) | set(totals), key=str):
            have = totals.get(movie, {"count": 0, "sum": 0})
            want = expected.get(movie, [])
            if have.get("count") != len(want) or have.get("sum") != sum(want):
                errors.append(
                    f"movie {movie}'s rating totals are count {have.get('count')} sum {have.get('sum')}, "
                    f"but its {len(want)} stored reviews give count {len(want)} sum {sum(want)}"
                )
        return errors


def _review_problem(rid: Key, review: Any) -> str | None:
    """Why a stored review is incomplete or malformed, or None."""
    if not isinstance(review, dict):
        return f"review {rid} is not a record: {review!r}"
    missing = [f for f in REVIEW_FIELDS if review.get(f) in (None, "")]
    if missing:
        return f"review {rid} lacks {', '.join(missing)}"
    if review["review_id"] != rid:
        return f"review stored under {rid} has review_id {review['review_id']}"
    not_text = [f for f in ("user_id", "movie_id", "text") if not isinstance(review[f], str)]
    if not_text:
        return f"review {rid} has non-string {', '.join(not_text)}"
    rating = review["rating"]
    if not isinstance(rating, int) or isinstance(rating, bool) or not 0 <= rating <= MAX_RATING:
        return f"review {rid} has rating {rating!r}, expected an int in 0..{MAX_RATING}"
    return None
