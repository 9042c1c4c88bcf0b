"""The commands that talk to the HTTP gateway: ``styx invocations get|list`` and ``styx console``.

Plain ``urllib`` (the SDK install has no HTTP client dependency); the gateway is found by
``--gateway``, else ``$STYX_GATEWAY_URL`` (which ``styx up`` writes into its cluster file); its
bearer token by ``--token-file``, else ``$STYX_GATEWAY_TOKEN`` (never a plain argument: argv is visible
in ``ps``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import webbrowser
from pathlib import Path
from typing import Any

from styx_py.core.addresses import url_option
from styx_py.core.errors import StyxError

__all__ = [
    "EXIT_FAILED",
    "EXIT_PENDING",
    "EXIT_UNKNOWN_REQUEST",
    "add_gateway_commands",
    "gateway_token",
    "gateway_url",
]

EXIT_FAILED = 3  # the transaction aborted or failed (styx call, styx invocations get)
EXIT_UNKNOWN_REQUEST = 4  # styx invocations get: the gateway knows no invocation with this id
# styx invocations get: no reply yet (still running, or --wait ran out); styx scale: not done in time
EXIT_PENDING = 5
STATUSES = ("pending", "committed", "aborted", "failed", "error")  # of GET /v1/invocations


def gateway_token(args: argparse.Namespace) -> str | None:
    """``--token-file``, else ``$STYX_GATEWAY_TOKEN``."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise StyxError(f"cannot read --token-file {args.token_file}: {exc}") from exc
        if not token:
            raise StyxError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get("STYX_GATEWAY_TOKEN") or None


def gateway_url(args: argparse.Namespace) -> str:
    url = args.gateway or os.environ.get("STYX_GATEWAY_URL")
    if not url:
        raise StyxError("no gateway URL: pass --gateway URL, set STYX_GATEWAY_URL or run 'styx up'")
    return str(url).rstrip("/")


def _get(url: str, token: str | None, timeout_s: float) -> tuple[int, Any]:
    """GET ``url``: the status and the JSON body (any status; a body that is not JSON is an error)."""
    request = urllib.request.Request(url, headers={"accept": "application/json"})
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:
        raise StyxError(f"cannot reach the gateway at {url}: {exc}") from exc
    try:
        return status, json.loads(raw)
    except ValueError as exc:
        raise StyxError(f"the gateway answered {status} with a body that is not JSON: {raw[:200]!r}") from exc


def _refused(status: int, body: Any) -> StyxError:
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return StyxError(f"the gateway answered {status}: {body}")
    return StyxError(f"the gateway answered {status} {error.get('code')}: {error.get('message')}")


def cmd_invocations(args: argparse.Namespace) -> int:
    """``GET /v1/invocations/{id}`` on the gateway: print the reply; the exit code says what it was.
    ``--graph``: the invocation's view instead (``/view``: the reply with its call graph and entities)."""
    url = f"{gateway_url(args)}/v1/invocations/{urllib.parse.quote(args.request_id, safe='')}"
    if args.graph:
        return _view(url + "/view", gateway_token(args))
    if args.wait:
        url += f"?wait_s={args.wait:g}"
    status, body = _get(url, gateway_token(args), args.wait + 30)
    error = body.get("error") if isinstance(body, dict) else None
    if status == 200:
        print(json.dumps(body))
        return 0
    if status in (202, 504):
        print(json.dumps(body))
        return EXIT_PENDING
    if not isinstance(error, dict):
        raise _refused(status, body)
    if status == 404 and error.get("code") == "unknown_request":
        # The gateway's hint names its HTTP parameter; here the flag does the same.
        hint = ("long-poll with wait_s", "wait for it with --wait SECONDS")
        message = str(error.get("message")).replace(*hint)
        print(f"styx: {message}", file=sys.stderr)
        return EXIT_UNKNOWN_REQUEST
    if error.get("reply"):  # the cluster's answer: aborted (409) or failed (422)
        print(json.dumps(error["reply"]))
        return EXIT_FAILED
    raise _refused(status, body)


def _view(url: str, token: str | None) -> int:
    """Print the view's JSON, then its call graph for a person (on stderr)."""
    status, body = _get(url, token, 30)
    if status == 202:
        print(json.dumps(body))
        return EXIT_PENDING
    if status == 404 and isinstance(body, dict) and body.get("error", {}).get("code") == "unknown_request":
        print(f"styx: {body['error']['message']}", file=sys.stderr)
        return EXIT_UNKNOWN_REQUEST
    if status != 200:
        raise _refused(status, body)
    print(json.dumps(body))
    for call in body.get("calls") or []:
        where = ".".join(map(str, call["path"])) or "root"
        what = "wrote" if call["wrote"] else "read"
        line = f"{'  ' * len(call['path'])}{where}: {call['operator']}/{call['key']}.{call['function']}"
        print(f"{line} {call['status']}, {what}", file=sys.stderr)
    return 0 if body["status"] == "committed" else EXIT_FAILED


def cmd_invocations_list(args: argparse.Namespace) -> int:
    """``GET /v1/invocations`` on the gateway: a table (or ``--json``), newest first."""
    query = {"limit": args.limit, "status": args.status, "operator": args.operator, "after": args.after}
    query["scope"] = "cluster" if args.cluster else None
    params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
    status, body = _get(f"{gateway_url(args)}/v1/invocations?{params}", gateway_token(args), 30)
    if status != 200:
        raise _refused(status, body)
    if args.json:
        print(json.dumps(body))
        return 0
    rows = [
        [
            i["request_id"],
            i["status"],
            i["operator"],
            json.dumps(i["key"]) if isinstance(i["key"], int) else i["key"],
            i["function"],
            _dash(i["epoch"]),
            _dash(i["tid"]),
            "-" if i["latency_ms"] is None else f"{i['latency_ms']:.1f}",
        ]
        for i in body["invocations"]
    ]
    head = ["REQUEST ID", "STATUS", "OPERATOR", "KEY", "FUNCTION", "EPOCH", "TID", "MS"]
    widths = [max(len(str(r[c])) for r in [head, *rows]) for c in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    kept = f"{body['retained']} of the last {body['window']} kept by this gateway"
    if body.get("scope") == "cluster":
        kept = f"the newest of {body['retained']} recent transactions the workers retain"
        kept += "" if body["complete"] else "; some workers did not answer"
    more = f"; older: --after {body['next_after']}" if body["next_after"] else ""
    print(f"({len(rows)} shown, {kept}{more})")
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    """Print the console's URL (and open it with ``--open``)."""
    base = gateway_url(args)
    status, _ = _get(f"{base}/healthz", None, 10)
    if status != 200:
        raise StyxError(f"the gateway at {base} answered {status} on /healthz")
    url = f"{base}/console"
    print(url)
    if gateway_token(args):
        print("the gateway has a token: the page asks for it once per tab", file=sys.stderr)
    if args.open and not webbrowser.open(url):
        print("styx: no browser to open here; open the URL above", file=sys.stderr)
    return 0


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _gateway_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gateway",
        type=url_option,
        help="gateway URL (default: $STYX_GATEWAY_URL or the one 'styx up' started)",
    )
    p.add_argument("--token-file", help="file holding the gateway's bearer token (else $STYX_GATEWAY_TOKEN)")


def add_gateway_commands(sub: Any) -> None:
    """``styx invocations get|list`` and ``styx console`` on the CLI's subparsers."""
    inv = sub.add_parser(
        "invocations",
        help="list invocations, or look one up, on the HTTP gateway",
        description="'styx invocations get ID' prints the reply of a request id (GET /v1/invocations/ID "
        "on the gateway). Exit code 0: committed; 3: aborted or failed; 4: the gateway knows no such id; "
        "5: no reply yet; 2: any other error. 'styx invocations list' prints the gateway's recent "
        "invocations, newest first (GET /v1/invocations).",
    )
    inv_sub = inv.add_subparsers(dest="action", required=True)
    get = inv_sub.add_parser("get", help="print the reply of request id ID")
    get.add_argument("request_id", metavar="ID")
    _gateway_flags(get)
    get.add_argument(
        "--wait", type=float, default=0.0, help="seconds to wait for a pending reply (default 0)"
    )
    get.add_argument(
        "--graph",
        action="store_true",
        help="print the invocation's view instead: its call graph and the entities it touched "
        "(GET /v1/invocations/ID/view; the graph also on stderr)",
    )
    get.set_defaults(fn=cmd_invocations)
    ls = inv_sub.add_parser("list", help="the gateway's recent invocations, newest first")
    _gateway_flags(ls)
    ls.add_argument("--status", choices=STATUSES, help="only invocations with this status")
    ls.add_argument("--operator", help="only invocations of this operator")
    ls.add_argument("--limit", type=int, default=50, help="how many (default 50, at most 500)")
    ls.add_argument("--after", help="the cursor a previous page printed: list what is older")
    ls.add_argument("--json", action="store_true", help="print the gateway's JSON page")
    ls.add_argument(
        "--cluster",
        action="store_true",
        help="every worker's recent transactions, not just this gateway's (?scope=cluster)",
    )
    ls.set_defaults(fn=cmd_invocations_list)
    console = sub.add_parser(
        "console",
        help="print the URL of the gateway's web console",
        description="Prints the URL of the web console the gateway serves at /console (cluster, workers, "
        "epochs, recent invocations, entities); --open also opens it in a browser.",
    )
    _gateway_flags(console)
    console.add_argument("--open", action="store_true", help="open it in the default browser")
    console.set_defaults(fn=cmd_console)
