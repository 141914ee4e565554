"""`pipebd quotas`: the operator sets each token's fair-share weight and quotas, on the server's database
(PIPEBD_DATABASE_URL, or the data folder's SQLite file), as `pipebd api` and `pipebd worker` find it.

pipebd quotas list [--json]                       every tenant's weight, quotas and use now
pipebd quotas set NAME --token TOKEN [...]        create or change a tenant's row (--tenant FINGERPRINT instead)
pipebd quotas delete NAME                         back to weight 1 and no quota

A token is given to be fingerprinted (app.api.auth.fingerprint, as jobs record who submitted them); it is
never stored. `--max-running none` (or `--device-hours none`) clears a limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from app.cli.output import print_json, table
from pipebd_core.cli import fail

FIELDS = ("weight", "max_running", "device_hours", "window_h")


def hours_or_none(value: str) -> float | None:
    """A budget on the command line: a number, or `none` to clear it."""
    return None if value.lower() == "none" else float(value)


def count_or_none(value: str) -> int | None:
    """A count on the command line: a whole number, or `none` to clear it."""
    return None if value.lower() == "none" else int(value)


def add_quota_commands(commands: Any) -> None:
    quotas = commands.add_parser("quotas", help="set or list each token's fair-share weight and quotas")
    actions = quotas.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every tenant's weight, quotas and use now")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    setting = actions.add_parser("set", help="create or change a tenant's weight and quotas")
    setting.add_argument("name", help="how reasons and pages name the tenant, e.g. alice")
    who = setting.add_mutually_exclusive_group()
    who.add_argument("--token", help="the tenant's API token (fingerprinted, never stored)")
    who.add_argument("--tenant", help="the token's fingerprint, as `pipebd quotas list` shows it")
    unset = argparse.SUPPRESS  # a field not given keeps its value
    weight_help = "its share of running devices against other tenants' weights (default 1)"
    setting.add_argument("--weight", type=float, default=unset, help=weight_help)
    setting.add_argument("--max-running", type=count_or_none, default=unset, help="its jobs launched at once, or none")
    setting.add_argument("--device-hours", type=hours_or_none, default=unset, help="ranks x hours per window, or none")
    setting.add_argument("--window-h", type=float, default=unset, help="the budget's rolling window (default 24 h)")
    setting.add_argument("--json", action="store_true", help="print the row as JSON")
    deleting = actions.add_parser("delete", help="remove a tenant's row: weight 1, no quota")
    deleting.add_argument("name", help="the tenant's name or fingerprint")
    for parser in (listing, setting, deleting):
        parser.add_argument("--data-dir", help="data folder (PIPEBD_DATA_DIR, default .pipebd)")
        parser.set_defaults(handler=command_quotas)


def command_quotas(args: argparse.Namespace) -> int:
    if args.data_dir is not None:
        os.environ["PIPEBD_DATA_DIR"] = args.data_dir
    from sqlmodel import Session

    from app.core.database import get_engine, migrate
    from app.core.settings import Settings

    database = Settings().database
    migrate(database)
    with Session(get_engine(database), expire_on_commit=False) as session:
        try:
            return {"list": list_quotas, "set": set_quota_row, "delete": delete_quota}[args.action](session, args)
        except ValueError as error:
            return fail(str(error))


def list_quotas(session: Any, args: argparse.Namespace) -> int:
    from app.services.quotas import report

    rows = report(session)
    if args.json:
        print_json([dataclasses.asdict(row) for row in rows])
        return 0
    headers = ("name", "tenant", "weight", "max running", "device-hours", "window h", "running", "devices", "used")
    values = [(r.name, r.tenant[:8], r.weight, r.max_running, r.device_hours, r.window_h, *in_use(r)) for r in rows]
    print(table(headers, values))
    return 0


def in_use(row: Any) -> tuple[int, int, str]:
    """A report row's use now: running jobs, their devices, device-hours in the window."""
    return row.running_jobs, row.running_devices, f"{row.used_device_hours:.2f}"


def set_quota_row(session: Any, args: argparse.Namespace) -> int:
    from app.api.auth import fingerprint
    from app.services.quotas import find_quota, set_quota

    existing = find_quota(session, args.name)
    tenant = fingerprint(args.token) if args.token else args.tenant or (existing.tenant if existing else None)
    if tenant is None:
        raise ValueError(f"no tenant is named {args.name!r} yet: give its --token (or --tenant FINGERPRINT)")
    changes = {field: getattr(args, field) for field in FIELDS if hasattr(args, field)}
    quota = set_quota(session, tenant=tenant, name=args.name, changes=changes)
    session.commit()
    print_json(quota.model_dump()) if args.json else print(f"tenant {quota.name} ({quota.tenant[:8]}) set")
    return 0


def delete_quota(session: Any, args: argparse.Namespace) -> int:
    from app.services.quotas import find_quota

    quota = find_quota(session, args.name)
    if quota is None:
        raise ValueError(f"no tenant is named {args.name!r}: `pipebd quotas list` shows the names")
    session.delete(quota)
    session.commit()
    print(f"tenant {quota.name} removed: weight 1, no quota")
    return 0
