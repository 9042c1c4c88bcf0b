"""``styx state get|list``: committed state as of one epoch, read from the workers' memory.

``styx state get OPERATOR KEY`` prints one entity's stored value (no function runs); ``styx state list
OPERATOR`` prints its entities in key order, page after page, all as of one epoch. Both take
``--as-of-epoch E`` for an epoch within the workers' window (``state_window_epochs``); an older one is
refused (exit 4, ``styx sql --as-of-epoch`` reads those from the snapshots). They ask the coordinator
(:mod:`styx_py.io.stateread`), authenticated with the cluster secret as ``styx status`` is.

Output: one JSON object per line (``{"key", "value"}``), then ``{"epoch", "rows", "cursor"}`` on
stderr for ``list``; ``--json`` prints one JSON document instead. Exit codes: 0 found; 3 ``get`` of an
entity that does not exist at that epoch; 4 the epoch is out of the window or not committed yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from styx_py.core.addresses import host_port_option
from styx_py.core.errors import StateReadRefused
from styx_py.core.limits import MAX_READ_PAGE, READ_PAGE

__all__ = ["EXIT_MISSING", "EXIT_OUT_OF_WINDOW", "add_state_commands"]

EXIT_MISSING = 3
EXIT_OUT_OF_WINDOW = 4


def rows_per_second(text: str) -> float:
    """``--rows-per-s``: a rate above 0 (argparse names the option and exits 2 otherwise)."""
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not 0 < rate < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of rows a second above 0, got {text!r}")
    return rate


def add_state_commands(sub: Any, parse_key: Any) -> None:
    """``styx state get|list`` on the CLI's subparsers; ``parse_key`` reads a key argument (JSON number:
    an int key, otherwise a string)."""
    st = sub.add_parser(
        "state",
        help="read committed state as of one epoch (no transaction; from the workers' memory)",
        description="'styx state get OPERATOR KEY' prints one entity's stored value; 'styx state list "
        "OPERATOR' its entities in key order, all as of one committed epoch (the newest, or "
        "--as-of-epoch within the workers' window). Exit 3: no such entity at that epoch; 4: the epoch "
        "is older than the window (use 'styx sql --as-of-epoch') or not committed yet.",
    )
    st_sub = st.add_subparsers(dest="action", required=True)
    get = st_sub.add_parser("get", help="one entity's stored value")
    get.add_argument("operator")
    get.add_argument("key", help="entity key (JSON number → int key, otherwise a string)")
    ls = st_sub.add_parser("list", help="an operator's entities in key order, as of one epoch")
    ls.add_argument("operator")
    ls.add_argument("--prefix", help="only str keys that start with this")
    bound = ls.add_mutually_exclusive_group()
    bound.add_argument("--start", help="from this key on (inclusive)")
    bound.add_argument("--after", help="after this key (exclusive)")
    bound.add_argument("--cursor", help="resume where a previous list stopped (its cursor)")
    ls.add_argument("--end", help="up to this key (exclusive)")
    ls.add_argument("--limit", type=int, default=None, help="at most this many entities (default: all)")
    ls.add_argument(
        "--page-size",
        type=int,
        default=READ_PAGE,
        help=f"rows per request (1..{MAX_READ_PAGE}; larger pages cost less CPU, and hold the cluster's "
        "event loops longer per page)",
    )
    ls.add_argument(
        "--rows-per-s",
        type=rows_per_second,
        default=None,
        help="pace the listing to this many rows a second (a background scan beside live traffic)",
    )
    for p in (get, ls):
        p.add_argument(
            "--coordinator",
            type=host_port_option,
            help="HOST:PORT (default: $STYX_COORDINATOR or the cluster from 'styx up')",
        )
        p.add_argument("--as-of-epoch", type=int, default=None, metavar="E", help="read epoch E")
        p.add_argument(
            "--min-epoch",
            type=int,
            default=-1,
            metavar="E",
            help="without --as-of-epoch: read no epoch older than E (a reply's epoch: see its writes)",
        )
        p.add_argument("--json", action="store_true", help="print one JSON document")
        p.set_defaults(fn=lambda args: cmd_state(args, parse_key))


def cmd_state(args: argparse.Namespace, parse_key: Any) -> int:
    from styx_py.io import stateread
    from styx_py.stack.local import cluster_secret, coordinator_address

    address = coordinator_address(args.coordinator)
    source = stateread.admin_reads(address, secret=cluster_secret(address))

    def key_of(text: str | None) -> Any:
        return None if text is None else parse_key(text)

    async def get() -> int:
        epoch, found, value = await stateread.read_value(
            source, args.operator, key_of(args.key), args.as_of_epoch, args.min_epoch
        )
        out = {"operator": args.operator, "key": key_of(args.key), "epoch": epoch, "found": found}
        print(json.dumps({**out, "value": value}, default=repr))
        return 0 if found else EXIT_MISSING

    async def listing() -> int:
        rows: list[dict[str, Any]] = []
        epoch, cursor, count = -1, None, 0
        async for page in stateread.scan(
            source,
            args.operator,
            prefix=args.prefix,
            start=key_of(args.start),
            after=key_of(args.after),
            end=key_of(args.end),
            limit=args.limit,
            page_size=args.page_size,
            as_of_epoch=args.as_of_epoch,
            cursor=args.cursor,
            rows_per_s=args.rows_per_s,
            min_epoch=args.min_epoch,
        ):
            epoch, cursor, count = page.epoch, page.cursor, count + len(page.rows)
            for k, v in page.rows:
                if args.json:
                    rows.append({"key": k, "value": v})
                else:
                    print(json.dumps({"key": k, "value": v}, default=repr))
        summary = {"epoch": epoch, "rows": count, "cursor": cursor}
        if args.json:
            print(json.dumps({"operator": args.operator, **summary, "items": rows}, default=repr))
        else:
            print(json.dumps(summary), file=sys.stderr)
        return 0

    try:
        return asyncio.run(get() if args.action == "get" else listing())
    except StateReadRefused as exc:
        if exc.code in ("out-of-window", "not-committed"):
            print(f"styx: {exc}", file=sys.stderr)
            return EXIT_OUT_OF_WINDOW
        raise
