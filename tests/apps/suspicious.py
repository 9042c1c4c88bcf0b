"""Functions that call what a replay does not reproduce, in the usual spellings; and clean ones."""

from __future__ import annotations

import datetime
import os
import random
import secrets
import time
import uuid
from datetime import datetime as dt
from random import randint

from styx_py import Context, Graph, Operator

thing = Operator("thing", partitions=2)


@thing.function
async def module_calls(ctx: Context) -> list[object]:
    return [
        random.random(),
        time.time(),
        uuid.uuid4().hex,
        secrets.token_hex(4),
        os.urandom(2),
        datetime.datetime.now().year,
    ]


@thing.function
async def imported_names(ctx: Context) -> list[object]:
    return [randint(1, 6), dt.utcnow().year, hash(ctx.key)]


@thing.function
async def clean(ctx: Context) -> list[object]:
    seen = time.strftime("%Y", time.gmtime(ctx.now()))  # formatting a sequenced time is fine
    return [ctx.random(), ctx.now(), str(ctx.uuid()), seen, uuid.UUID(int=7).hex]


app = Graph("suspicious", [thing])
