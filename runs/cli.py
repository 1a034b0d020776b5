"""``awaken``, the command line, on the typed client (``runs.client``) and Typer.

Configured by ``--url``/``--token``, else ``AWAKEN_URL``/``AWAKEN_TOKEN``, else the config
file ``awaken login`` writes (``$AWAKEN_CONFIG``, default ``~/.config/awaken/config.json``,
mode 0600). ``--json`` on every command prints the API's JSON. The three are global: given
before the command (``awaken --json runs ls``) or after it (``awaken runs ls --json``). Exit
status: 0 done, 1 refused by the server (its ``code`` and message on stderr), 2 usage error,
3 server unreachable. Controls sent from here record source ``cli``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from runs.client import ApiError, Client, Unreachable

REFUSED, USAGE, UNREACHABLE = 1, 2, 3
FILTER_KEYS = ("state", "end_cause", "agent", "thread_id", "parent_id", "status", "q",
               "id_prefix", "error", "created_after", "created_before")

app = typer.Typer(help="Control awaken-site runs from the shell.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
runs_app = typer.Typer(help="Runs: list, show, follow, create and control them.",
                       no_args_is_help=True)
bulk_app = typer.Typer(help="Cancel or stop many runs as one job.", no_args_is_help=True)
workers_app = typer.Typer(help="The workers.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(bulk_app, name="bulk")
app.add_typer(workers_app, name="workers")

out = Console()
err = Console(stderr=True)

def config_path() -> Path:
    if os.environ.get("AWAKEN_CONFIG"):
        return Path(os.environ["AWAKEN_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "awaken" / "config.json"


def saved() -> dict:
    try:
        return json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}


class Settings:
    url: str | None = None
    token: str | None = None
    as_json: bool = False


settings = Settings()

URL_HELP, TOKEN_HELP, JSON_HELP = "The site's URL.", "An API token.", "Print the API's JSON."


@app.callback()
def configure(
    url: Annotated[str | None, typer.Option(envvar="AWAKEN_URL", help=URL_HELP)] = None,
    token: Annotated[str | None, typer.Option(envvar="AWAKEN_TOKEN", help=TOKEN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
):
    settings.url, settings.token, settings.as_json = url, token, as_json


GLOBAL_OPTIONS = [
    inspect.Parameter("url", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, typer.Option("--url", help=URL_HELP)]),
    inspect.Parameter("token", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[str | None, typer.Option("--token",
                                                                    help=TOKEN_HELP)]),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, typer.Option("--json", help=JSON_HELP)]),
]


def taking_global_options(command):
    """``command`` taking ``--url``, ``--token`` and ``--json`` after its name too: given
    there, each wins over what came before the command (and over the environment, which
    only the top reads)."""
    signature = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        for option in GLOBAL_OPTIONS:
            value = kwargs.pop(option.name)
            if value:
                setattr(settings, option.name, value)
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(
        parameters=[*signature.parameters.values(), *GLOBAL_OPTIONS])
    wrapper.__annotations__ = {
        **{name: p.annotation for name, p in signature.parameters.items()},
        **{option.name: option.annotation for option in GLOBAL_OPTIONS}}
    return wrapper


def client() -> Client:
    config = saved()
    url = settings.url or config.get("url")
    if not url:
        raise typer.BadParameter("no site: give --url, set AWAKEN_URL or run awaken login",
                                 param_hint="--url")
    return Client(url, token=settings.token or config.get("token"), source="cli")


def emit(data, text=None) -> None:
    if settings.as_json:
        out.print_json(json.dumps(data))
    elif text is not None:
        text(data)


def parse_json(value: str | None, option: str):
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint=option) from None


def parse_filter(value: str) -> dict:
    criteria = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        key, sep, item = part.partition("=")
        if not sep or not key or not item:
            raise typer.BadParameter(f"{part!r} is not KEY=VALUE", param_hint="--filter")
        if key in criteria:  # state=running,state=queued: any of them
            criteria[key] = f"{criteria[key]},{item}"
        else:
            criteria[key] = item
    if not criteria:
        raise typer.BadParameter("give at least one KEY=VALUE", param_hint="--filter")
    return criteria


def short(run: dict) -> str:
    state = run["state"] if run["state"] != "ended" else f"ended/{run['end_cause']}"
    return f"{run['id']}  {run['agent']}  {state}  v{run['version']}"


def run_table(runs: list[dict]) -> None:
    table = Table(box=None)
    for column in ("ID", "AGENT", "STATE", "STEPS", "CREATED"):
        table.add_column(column)
    for run in runs:
        state = run["state"] if run["state"] != "ended" else f"ended ({run['end_cause']})"
        table.add_row(run["id"], run["agent"], state, str(run["usage"]["steps"]),
                      run["created_at"])
    out.print(table)


def show_run(run: dict) -> None:
    out.print(short(run))
    for key in ("thread_id", "stop_code", "stop_reason", "error"):
        if run.get(key):
            out.print(f"  {key}: {run[key]}")
    if run.get("ticket"):
        out.print(f"  ticket: {run['ticket']['id']} ({run['ticket']['reason']})")
    if run.get("control"):
        control = run["control"]
        out.print(f"  control: {control['action']} by {control['requested_by']} "
                  f"({control['source']})")
    if run.get("output") is not None:
        out.print(f"  output: {json.dumps(run['output'])}")


# --- runs -----------------------------------------------------------------------------------


@runs_app.command("ls")
def runs_ls(
    state: Annotated[str | None, typer.Option(help="queued, running, awaiting or ended.")] = None,
    agent: Annotated[str | None, typer.Option()] = None,
    q: Annotated[str | None, typer.Option(help="Search: id prefix, thread or agent.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 20,
):
    """The runs, newest first."""
    with client() as awaken:
        runs = list(awaken.runs.list(state=state, agent=agent, q=q, limit=limit))
    emit(runs, run_table)


@runs_app.command("show")
def runs_show(run_id: str):
    """One run."""
    with client() as awaken:
        emit(awaken.runs.get(run_id), show_run)


@runs_app.command("tail")
def runs_tail(run_id: Annotated[str | None, typer.Argument()] = None):
    """Follow one run (until it ends) or every run (until Ctrl-C), live."""
    with client() as awaken:
        status = None if settings.as_json or not err.is_terminal else err.status("following…")
        if status is not None:
            status.start()
        try:
            for message in awaken.runs.stream(run_id):
                runs = message.get("runs") or [message["run"]]
                if settings.as_json:
                    print(json.dumps(message), flush=True)
                else:
                    for run in runs:
                        kind = message.get("event", {}).get("kind", "snapshot")
                        out.print(f"{message['seq']:>8}  {kind:<16} {short(run)}")
                if status is not None:
                    status.update(f"following… seq {message['seq']}")
                if run_id is not None and runs and runs[0]["state"] == "ended":
                    return
        except KeyboardInterrupt:
            return
        finally:
            if status is not None:
                status.stop()


@runs_app.command("create")
def runs_create(
    agent: str,
    input: Annotated[str | None, typer.Option("--input", help="The input, JSON.")] = None,
):
    """Create a run."""
    body = parse_json(input, "--input")
    with client() as awaken:
        emit(awaken.runs.create(agent, input=body), show_run)


def control_each(run_ids: list[str], act) -> None:
    with client() as awaken:
        answers = [act(awaken, run_id) for run_id in run_ids]
    emit(answers if len(answers) > 1 else answers[0],
         lambda _: [show_run(run) for run in answers])


@runs_app.command("cancel")
def runs_cancel(run_ids: list[str],
                reason: Annotated[str | None, typer.Option()] = None):
    """Cancel runs."""
    control_each(run_ids, lambda a, r: a.runs.cancel(r, reason=reason))


@runs_app.command("stop")
def runs_stop(run_ids: list[str], reason: Annotated[str, typer.Option(help="Why (required).")]):
    """Stop runs, with a reason."""
    control_each(run_ids, lambda a, r: a.runs.stop(r, reason=reason))


@runs_app.command("pause")
def runs_pause(run_ids: list[str]):
    """Pause runs at their next step boundary."""
    control_each(run_ids, lambda a, r: a.runs.pause(r))


@runs_app.command("resume")
def runs_resume(run_ids: list[str],
                ticket: Annotated[str | None, typer.Option(
                    help="The ticket (default: each run's open one).")] = None,
                input: Annotated[str | None, typer.Option("--input", help="JSON.")] = None):
    """Resume awaiting runs."""
    body = parse_json(input, "--input")

    def resume(awaken, run_id):
        chosen = ticket or ((awaken.runs.get(run_id).get("ticket") or {}).get("id") or "")
        return awaken.runs.resume(run_id, ticket=chosen, input=body)

    control_each(run_ids, resume)


# --- bulk -----------------------------------------------------------------------------------


def bulk(action: str, filter_text: str, reason: str | None, dry_run: bool):
    criteria = parse_filter(filter_text)
    with client() as awaken:
        preview = awaken.bulk.preview(filter=criteria)
        if dry_run:
            emit(preview, lambda p: out.print(
                f"{p['total']} runs selected, {p['live']} not ended; nothing started"))
            return
        job = awaken.bulk.create(action, filter=criteria, reason=reason)
        show = not settings.as_json and err.is_terminal
        with Progress(TextColumn(f"{action}"), BarColumn(), MofNCompleteColumn(),
                      console=err, disable=not show) as progress:
            bar = progress.add_task(action, total=job["total"] or 1)
            while job["state"] not in ("done", "aborted"):
                progress.update(bar, total=job["total"] or 1, completed=job["done"])
                time.sleep(0.3)
                job = awaken.bulk.get(job["id"])
            progress.update(bar, total=job["total"] or 1, completed=job["done"])
    emit(job, lambda j: out.print(
        f"job {j['id']}: {j['state']}; {j['applied']} applied, {j['unchanged']} unchanged, "
        f"{j['refused']} refused of {j['total']}"))


FilterOption = Annotated[str, typer.Option(
    "--filter", help="KEY=VALUE,… of the run list's filters (state=running,agent=X).")]


@bulk_app.command("cancel")
def bulk_cancel(filter_text: FilterOption,
                reason: Annotated[str | None, typer.Option()] = None,
                dry_run: Annotated[bool, typer.Option("--dry-run", help=(
                    "Print how many runs it would take; start nothing."))] = False):
    """Cancel every run the filter selects."""
    bulk("cancel", filter_text, reason, dry_run)


@bulk_app.command("stop")
def bulk_stop(filter_text: FilterOption,
              reason: Annotated[str | None, typer.Option(help="Why (required).")] = None,
              dry_run: Annotated[bool, typer.Option("--dry-run")] = False):
    """Stop every run the filter selects."""
    if not reason and not dry_run:
        raise typer.BadParameter("a stop needs a reason", param_hint="--reason")
    bulk("stop", filter_text, reason, dry_run)


# --- workers and login ----------------------------------------------------------------------


@workers_app.command("ls")
def workers_ls():
    """The workers, alive or not."""
    def table(workers):
        grid = Table(box=None)
        for column in ("NAME", "ALIVE", "DRAINING", "CAPACITY", "LIVE", "LAST SEEN"):
            grid.add_column(column)
        for w in workers:
            grid.add_row(w["name"], str(w["alive"]), str(w["draining"]), str(w["capacity"]),
                         str(w["live_attempts"]), w["last_seen"])
        out.print(grid)

    with client() as awaken:
        emit(awaken.workers.list(), table)


@app.command("login")
def login():
    """Check the URL and token and save them in the config file (mode 0600)."""
    url = settings.url or typer.prompt("URL")
    token = settings.token or typer.prompt("Token", hide_input=True)
    with Client(url, token=token, source="cli") as awaken:
        next(iter(awaken.runs.list(limit=1)), None)  # refused (1) or unreachable (3) here
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        json.dump({"url": url, "token": token}, file)
    emit({"url": url, "config": str(path)},
         lambda d: out.print(f"Logged in to {d['url']}; saved in {d['config']}"))


for commands in (app, runs_app, bulk_app, workers_app):
    for info in commands.registered_commands:
        info.callback = taking_global_options(info.callback)


def main(argv: list[str] | None = None) -> int:
    """The console script: Typer's command (which exits 2 on a usage error), with the API's
    refusals (1) and an unreachable server (3) as exit statuses."""
    try:
        app(args=argv, prog_name="awaken")
    except ApiError as error:
        err.print(f"{error.code}: {error.detail}", markup=False, highlight=False)
        return REFUSED
    except Unreachable as error:
        err.print(f"cannot reach the server: {error}", markup=False, highlight=False)
        return UNREACHABLE
    return 0


if __name__ == "__main__":
    sys.exit(main())
