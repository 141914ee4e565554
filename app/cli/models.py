"""The commands on a server's registered models: `pipebd models` (a page of them, filtered, or every page),
`pipebd models ID` (one, with its lineage) and `pipebd choose ID --params 0.4 --kv-cache 0.25` (a finished
search chosen again for another budget: the new registered model). Tables, or with --json the server's JSON;
a refusal or an unreachable server is one error line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from app.cli.client import call, get_json, paged
from app.cli.jobs import handles_refusals
from app.cli.output import fields, print_json, table
from app.cli.responses import LineageJson, ModelJson

MODELS = "/api/v1/models"
CHOOSE_TIMEOUT_S = 330  # the server gives a choice 300 s (app/services/models.py), then answers


def quality(model: ModelJson) -> str | None:
    metrics = model["metrics"]
    perplexity, top1 = metrics.get("perplexity"), metrics.get("top1")
    if perplexity is not None:
        return f"ppl {perplexity:.2f}"
    if top1 is not None:
        return f"top-1 {100 * top1:.1f}%"
    return None


def model_row(model: ModelJson) -> list[Any]:
    size = sum(entry["size"] for entry in model["files"])
    return [
        model["id"],
        model["kind"],
        model["job_id"],
        model["parent_id"],
        quality(model),
        model["metrics"].get("params"),
        size,
        model["created_at"],
    ]


HEADERS = ["id", "kind", "job", "parent", "quality", "params", "bytes", "created"]


def describe(model: ModelJson, lineage: LineageJson) -> str:
    chain = " -> ".join(f"#{item['id']} {item['kind']}" for item in lineage["chain"])
    lines = [
        fields(
            [
                ("model", f"{model['id']} {model['name']} ({model['kind']})"),
                ("job", model["job_id"]),
                ("parent", model["parent_id"] or (model["parent_hash"] and f"content {model['parent_hash'][:16]}")),
                ("chain", chain),
                ("quality", quality(model)),
                ("params", model["metrics"].get("params")),
                ("files present", "yes" if model["files_present"] else "no (its job was deleted)"),
                ("spec hash", model["spec_hash"]),
                ("data", model["data_fingerprint"]),
                ("mlflow", model.get("mlflow_version")),
                ("created", model["created_at"]),
            ]
        ),
        "",
        table(["file", "bytes", "sha256"], [[f["path"], f["size"], f["sha256"][:16]] for f in model["files"]]),
    ]
    if lineage["descendants"]:
        rows = [model_row(item) for item in lineage["descendants"]]
        lines += ["", "made from it:", table(HEADERS, rows)]
    return "\n".join(lines)


@handles_refusals
def command_models(args: argparse.Namespace) -> int:
    if args.model_id is not None:
        model: ModelJson = get_json(args.server, args.token, f"{MODELS}/{args.model_id}")
        lineage: LineageJson = get_json(args.server, args.token, f"{MODELS}/{args.model_id}/lineage")
        if args.json:
            print_json({**model, "lineage": lineage})
        else:
            print(describe(model, lineage), flush=True)
        return 0
    query = {"job_id": args.job, "kind": args.kind, "parent_id": args.parent, "limit": args.limit}
    models, next_cursor = paged(args.server, args.token, MODELS, query, args.cursor, args.all)
    if args.json:
        print_json({"data": models, "next_cursor": next_cursor})
        return 0
    print(table(HEADERS, [model_row(model) for model in models]) if models else "no models", flush=True)
    if next_cursor is not None:
        print(f"pipebd: more models: pipebd models --cursor {next_cursor} (or --all)", file=sys.stderr)
    return 0


@handles_refusals
def command_choose(args: argparse.Namespace) -> int:
    budget = {"params": args.params, "kv_cache": args.kv_cache, "latency": args.latency}
    body = {"budget": {name: value for name, value in budget.items() if value is not None} or None}
    path = f"/api/v1/jobs/{args.job_id}/choose"
    model: ModelJson = call("POST", args.server, args.token, path, json=body, timeout=CHOOSE_TIMEOUT_S).json()
    if args.json:
        print_json(model)
        return 0
    architecture = model.get("architecture")
    layers = [", ".join(block["layers"]) for block in (architecture["blocks"] if architecture else [])]
    reached = model["metrics"].get("reached") or {}
    print(
        fields(
            [
                ("model", f"{model['id']} {model['name']} (chosen from model {model['parent_id']})"),
                ("layers", " | ".join(layers)),
                ("reached", ", ".join(f"{name} {100 * value:.1f}%" for name, value in reached.items())),
                ("quality", quality(model)),
            ]
        ),
        flush=True,
    )
    return 0


def add_model_commands(commands: Any, add_server_options: Callable[[argparse.ArgumentParser], None]) -> None:
    models = commands.add_parser("models", help="list a server's registered models, or show one with its lineage")
    models.add_argument("model_id", type=int, nargs="?", metavar="ID", help="one model: its lineage and files")
    add_server_options(models)
    models.add_argument("--kind", help="only this kind: teacher, distilled, searched, finetuned, chosen")
    models.add_argument("--job", type=int, help="only the models of this job")
    models.add_argument("--parent", type=int, help="only the models made from this model")
    models.add_argument("--limit", type=int, default=50, help="models per page (default 50)")
    models.add_argument("--cursor", help="the page after the one that printed this cursor")
    models.add_argument("--all", action="store_true", help="every page, not only the first")
    models.set_defaults(handler=command_models)
    choose = commands.add_parser("choose", help="choose a finished search's network again for another budget")
    choose.add_argument("job_id", type=int, metavar="ID", help="the search job's id")
    add_server_options(choose)
    for name in ("params", "kv-cache", "latency"):
        choose.add_argument(f"--{name}", type=float, help=f"budget: {name} as a fraction of the teacher's layers")
    choose.set_defaults(handler=command_choose)
