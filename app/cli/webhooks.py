"""`pipebd webhooks`: a server's webhooks from the command line, as `pipebd jobs` does jobs (docs/webhooks.md).

pipebd webhooks list                               every webhook with its deliveries by state
pipebd webhooks create URL --event E [--event E]   a new one (--scope, --job, --sweep, --secret or
                                                   PIPEBD_WEBHOOK_SECRET)
pipebd webhooks delete ID                          remove one (its delivery log goes with it)
pipebd webhooks deliveries ID [--state S] [--all]  its delivery log, newest first

Each prints compact tables, or with --json the server's JSON; a refusal or an unreachable server is one
error line and exit code 2 (app/cli/jobs.py `handles_refusals`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.cli.client import call, get_json, paged
from app.cli.jobs import handles_refusals
from app.cli.output import print_json, table
from app.cli.responses import DeliveryJson, WebhookJson

SCOPES = ("server", "token", "job", "sweep")  # app.core.webhooks.SCOPES, without importing the database layer

WEBHOOKS = "/api/v1/webhooks"


def add_webhook_commands(commands: Any, add_server_options: Any) -> None:
    """`pipebd webhooks` and its actions, each with the server options (`add_server_options`)."""
    webhooks = commands.add_parser("webhooks", help="list, create or delete a server's webhooks; their deliveries")
    actions = webhooks.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every webhook with its deliveries by state")
    create = actions.add_parser("create", help="register a webhook for chosen events")
    create.add_argument("url", help="where each event is POSTed (http:// or https://)")
    create.add_argument(
        "--event",
        action="append",
        required=True,
        help="job.<state>, phase.finished, sweep.finished or sweep.best_changed; repeat",
    )
    create.add_argument("--scope", default="server", choices=SCOPES, help="whose jobs and sweeps")
    create.add_argument("--job", type=int, dest="job_id", help="for --scope job: the job's id")
    create.add_argument("--sweep", type=int, dest="sweep_id", help="for --scope sweep: the sweep's id")
    create.add_argument(
        "--secret",
        default=os.environ.get("PIPEBD_WEBHOOK_SECRET"),
        help="signs every body (16+ characters; or PIPEBD_WEBHOOK_SECRET); never shown again",
    )
    create.add_argument("--description", default="", help="what it is for")
    delete = actions.add_parser("delete", help="remove a webhook and its delivery log")
    deliveries = actions.add_parser("deliveries", help="a webhook's delivery log, newest first")
    for parser in (delete, deliveries):
        parser.add_argument("webhook_id", type=int, metavar="ID", help="the webhook's id")
    deliveries.add_argument("--state", choices=("pending", "succeeded", "failed"), help="only deliveries in it")
    deliveries.add_argument("--limit", type=int, default=50, help="deliveries per page (default 50)")
    deliveries.add_argument("--cursor", help="the page after the one that printed this cursor")
    deliveries.add_argument("--all", action="store_true", help="every page, not only the first")
    for parser in (listing, create, delete, deliveries):
        add_server_options(parser)
        parser.set_defaults(handler=command_webhooks)


@handles_refusals
def command_webhooks(args: argparse.Namespace) -> int:
    actions = {"list": list_webhooks, "create": create_webhook, "delete": delete_webhook, "deliveries": log}
    actions[args.action](args)
    return 0


def hook_row(hook: WebhookJson) -> list[Any]:
    counts = hook["deliveries"]
    named = [(scope, id_) for scope, id_ in (("job", hook.get("job_id")), ("sweep", hook.get("sweep_id"))) if id_]
    where = hook["scope"] if not named else f"{named[0][0]} {named[0][1]}"
    events = ",".join(hook["events"])
    return [hook["id"], hook["url"], events, where, counts["pending"], counts["succeeded"], counts["failed"]]


HOOK_HEADERS = ["id", "url", "events", "scope", "pending", "succeeded", "failed"]


def list_webhooks(args: argparse.Namespace) -> None:
    hooks = get_json(args.server, args.token, WEBHOOKS)
    if args.json:
        print_json(hooks)
        return
    print(table(HOOK_HEADERS, [hook_row(hook) for hook in hooks["data"]]) if hooks["data"] else "no webhooks")


def create_webhook(args: argparse.Namespace) -> None:
    body = {"url": args.url, "events": args.event, "scope": args.scope, "description": args.description}
    body |= {"secret": args.secret or ""}
    body |= {name: getattr(args, name) for name in ("job_id", "sweep_id") if getattr(args, name) is not None}
    hook = call("POST", args.server, args.token, WEBHOOKS, json=body).json()
    print_json(hook) if args.json else print(table(HOOK_HEADERS, [hook_row(hook)]))


def delete_webhook(args: argparse.Namespace) -> None:
    call("DELETE", args.server, args.token, f"{WEBHOOKS}/{args.webhook_id}")
    print_json({"deleted": args.webhook_id}) if args.json else print(f"webhook {args.webhook_id} deleted")


def delivery_row(d: DeliveryJson) -> list[Any]:
    attempts = f"{d['attempts']}/{d['max_attempts']}"
    return [d["id"], d["event"], d["job_id"], d["state"], attempts, d["last_status"], d["created_at"], d["last_error"]]


def log(args: argparse.Namespace) -> None:
    query = {"state": args.state, "limit": args.limit}
    path = f"{WEBHOOKS}/{args.webhook_id}/deliveries"
    found, next_cursor = paged(args.server, args.token, path, query, args.cursor, args.all)
    if args.json:
        print_json({"data": found, "next_cursor": next_cursor})
        return
    headers = ["id", "event", "job", "state", "attempts", "status", "created", "error"]
    rows = [delivery_row(delivery) for delivery in found]
    print(table(headers, rows) if rows else "no deliveries", flush=True)
    if next_cursor is not None:
        more = f"pipebd webhooks deliveries {args.webhook_id} --cursor {next_cursor}"
        print(f"pipebd: more deliveries: {more} (or --all)", file=sys.stderr)
