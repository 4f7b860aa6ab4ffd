"""The dev sessions page of the console: what `hpctrain dev start|list|stop|save` do, as a page.

    GET  /dev[?idle-warn=T]   the sessions (age, GPUs held, state, idle time; a warning on one idle past T, by the
                              rule and default of `dev list --idle-warn`), how to open each (the exact tunnel
                              command and URL, with a copy button), and the form that starts one
    POST /dev/start           start a session from the form (CSRF token): the same Services.dev_start as the CLI, in a
                              thread of the console (it waits minutes for the server); the page shows its steps
    POST /dev/NAME/stop       stop it (confirmed on the page): Services.dev_stop
    POST /dev/NAME/save       save its environment as IMAGE: Services.dev_save; where the cluster cannot, its steps

Each session is asked of the scheduler it was started on (its connection record says which), through that
scheduler's services, as `hpctrain dev list` does; which scheduler that is, and what it can do, is the backend's
business: this module names none. The console does not proxy JupyterLab: the page shows the tunnel the CLI prints
(the session's token is in its URL; the console would otherwise have to hold and forward it).
"""

from __future__ import annotations

import argparse

import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from hpctrain.errors import UserError
from hpctrain.jobs.values import format_duration
from hpctrain.schedulers.service_api import Placement, Step
from hpctrain.servers import sessions
from hpctrain.web.safeview import line

START_WAIT_S = 600.0  # `dev start`'s default --wait
KEEP_STEPS = 20


@dataclass
class Starting:
    """A start under way in the console (or just ended): its steps as they come, then its lines or its error."""

    scheduler: str
    steps: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    error: str | None = None
    done: bool = False


def _text(fields: dict[str, list[str]], name: str) -> str | None:
    value = (fields.get(name) or [""])[0].strip()
    return value or None


def _count(fields: dict[str, list[str]], name: str, label: str, default: int) -> int:
    value = _text(fields, name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{label} {value!r}: give a whole number") from None


def placement_fields(scheduler: str) -> list[argparse.Action]:
    """The fields of a backend's own in the start form: the flags it declares for `dev start` that take a value
    (the connection, --namespace/--context, is the console's own)."""
    from hpctrain.engine.scheduling import backend_info, role_actions

    connection = set(backend_info(scheduler).connection_fields)
    return [a for a in role_actions(scheduler, "dev") if a.nargs != 0 and a.option_strings and a.dest not in connection]


def repeatable(action: argparse.Action) -> bool:
    """A flag given once for each value (`--mount A --mount B`): its field takes one value a line."""
    return isinstance(action, argparse._AppendAction)


def form_config(fields: dict[str, list[str]], services: Any) -> tuple[Any, Placement]:
    """The form's fields as `dev start`'s flags would make them: the DevConfig and Placement, checked by the same
    rules (DevConfig's, Resources', and the backend's refusal of the other backend's environment)."""
    from hpctrain.jobs.spec import Resources
    from hpctrain.jobs.values import parse_mem_bytes

    given: dict[str, Any] = {}
    for action in placement_fields(services.name):  # the backend's own flags of `dev start`, by dest
        value = _text(fields, action.dest)
        if value is not None and repeatable(action):  # one value a line, as the flag given once for each
            given[action.dest] = tuple(v.strip() for v in value.splitlines() if v.strip())
        elif value is not None:
            given[action.dest] = value
    placement = Placement(image=_text(fields, "image"), options=given)
    mem = _text(fields, "mem")
    resources = Resources(
        cpus_per_task=_count(fields, "cpus", "CPUs", 2),
        gpus_per_node=_count(fields, "gpus", "GPUs", 0),
        mem_bytes=None if mem is None else parse_mem_bytes(mem),
    )
    cfg = sessions.DevConfig(
        name=_text(fields, "name") or "",
        service=_text(fields, "service") or "jupyter",
        resources=resources,
        time=_text(fields, "time") or sessions.DEFAULT_TIME,
    )
    services.dev_render(cfg, placement)  # what the backend refuses (the other backend's environment) fails here
    return cfg, placement


class DevPages:
    def __init__(self, console: Any) -> None:  # hpctrain.web.app.Console, which builds these routes (no import back)
        self.console = console
        self.starts: dict[str, Starting] = {}
        self._lock = threading.Lock()

    def routes(self) -> list[Route]:
        return [
            Route("/dev", self.page),
            Route("/dev/start", self.start, methods=["POST"]),
            Route("/dev/{name}/stop", self.stop, methods=["POST"]),
            Route("/dev/{name}/save", self.save, methods=["POST"]),
        ]

    # ---- the list ---------------------------------------------------------------------------------------------

    def views(self) -> list[tuple[str, str, dict[str, Any], Any]]:
        """(name, scheduler, connection record, its SessionView or the UserError that says why not) of each
        recorded session, asked of the scheduler it was started on."""
        found = []
        for state_dir, conn in sessions.recorded():
            scheduler = str(conn.get("scheduler"))
            try:
                view: Any = self.console.scheduler(scheduler).services().dev_view(state_dir, conn, probe=True)
            except UserError as err:
                view = err
            found.append((state_dir.name, scheduler, conn, view))
        return found

    def rows(self, limit: int) -> list[dict[str, Any]]:
        """What the page shows of each session, with the idle warning past `limit` seconds. The sessions are asked
        of their schedulers at most once per interval for all open pages (the board), as the jobs are."""
        rows = []
        for name, scheduler, conn, view in self.console.board.get(("dev",), self.views):
            row: dict[str, Any] = {"name": name, "scheduler": line(scheduler), "error": None, "warning": None}
            if isinstance(view, UserError):
                row["error"] = line(str(view))
                rows.append(row)
                continue
            gpus = int(conn.get("gpus") or 0)
            row.update(
                where=line(view.where),
                state=line(view.state),
                age=format_duration(view.age_s) if view.age_s is not None else "-",
                idle=format_duration(view.idle_s) if view.idle_s is not None else "-",
                gpus=gpus,
                service=line(str(conn.get("service") or "")),
                ended=view.ended,
                forward=line(str(conn.get("tunnel") or conn.get("port_forward") or conn.get("ssh") or "")),
                url=line(str(conn.get("url") or "")),
            )
            if sessions.idle_too_long(view, limit):
                held = f"while holding {gpus} GPU(s)" if gpus else "while holding its node"
                row["warning"] = f"idle for {format_duration(view.idle_s or 0)} {held}: stop it if you are done"
            rows.append(row)
        return rows

    async def page(self, request: Request) -> Response:
        idle_warn = request.query_params.get("idle-warn") or sessions.IDLE_WARN
        limit = sessions.parse_time_s(idle_warn, "idle-warn")
        # The starts before the rows: a start that is done has dropped the board's list (_run_start), so rows read
        # after it show the session's final record (its tunnel and URL); read the other way round, a start that
        # ended in between left a page with neither a "starting" line nor the commands to open the session.
        with self._lock:
            starts = {name: _starting_view(s) for name, s in self.starts.items()}
        rows = await run_in_threadpool(self.rows, limit)
        return self.console.page(
            "dev.html",
            title="dev sessions",
            rows=rows,
            starts=starts,
            advice=sessions.SAVE_ADVICE,
            idle_warn=line(idle_warn),
            services=sessions.SERVICES,
            default_time=sessions.DEFAULT_TIME,
            backend_fields=[
                (name, [(a.dest, a.option_strings[0], a.help or "", repeatable(a)) for a in placement_fields(name)])
                for name in self.console.schedulers
            ],
            interval_s=self.console.board.interval_s,
        )

    # ---- start, stop, save ------------------------------------------------------------------------------------

    async def start(self, request: Request) -> Response:
        fields = parse_qs((await request.body()).decode("utf-8", "replace"))
        scheduler = _text(fields, "scheduler") or next(iter(self.console.schedulers))
        services = self.console.scheduler(scheduler).services()
        cfg, placement = await run_in_threadpool(form_config, fields, services)
        hold = ExitStack()
        hold.enter_context(sessions.starting(cfg.name))  # a second start of the name is refused now, in one line
        starting = Starting(scheduler)
        with self._lock:
            self.starts[cfg.name] = starting
        self.console.board.forget(("dev",))  # its record appears once submitted: the list is asked again
        threading.Thread(target=self._run_start, args=(hold, starting, services, cfg, placement), daemon=True).start()
        return RedirectResponse("/dev", status_code=303)

    def _run_start(self, hold: ExitStack, starting: Starting, services: Any, cfg: Any, placement: Placement) -> None:
        def on_step(step: Step) -> None:
            with self._lock:
                starting.steps[:] = [*starting.steps, line(step.text)][-KEEP_STEPS:]

        with hold:
            try:
                said = services.dev_start(cfg, placement, START_WAIT_S, None, on_step)
                lines = [line(text.strip()) for text in said if text.strip()]
                with self._lock:
                    starting.lines = lines
            except UserError as err:
                with self._lock:
                    starting.error = line(str(err))
            except Exception as err:  # a bug below: said on the page, the console goes on
                with self._lock:
                    starting.error = line(f"hpctrain could not start it ({type(err).__name__}: {err}): a bug")
            finally:
                self.console.board.forget(("dev",))
                with self._lock:
                    starting.done = True

    def _recorded(self, name: str) -> tuple[Any, dict[str, Any], Any]:
        state_dir, conn = sessions.connection(name)
        return state_dir, conn, self.console.scheduler(str(conn.get("scheduler"))).services()

    def stop(self, request: Request) -> Response:
        name = request.path_params["name"]
        state_dir, conn, services = self._recorded(name)
        said = services.dev_stop(state_dir, conn)
        self.console.board.forget(("dev",))
        with self._lock:
            self.starts.pop(name, None)
        return self.console.page(
            "dev_outcome.html", title=f"stop {line(name)}", what="stopped", session=line(name), lines=[line(said)]
        )

    async def save(self, request: Request) -> Response:
        name = request.path_params["name"]
        fields = parse_qs((await request.body()).decode("utf-8", "replace"))
        image = _text(fields, "image")
        if image is None:
            raise UserError(
                "save: give the new image's name, as `hpctrain dev save NAME IMAGE` takes it (see its --help)"
            )

        def run() -> Any:
            state_dir, conn, services = self._recorded(name)
            return services.dev_save(state_dir, conn, image, False)

        outcome = await run_in_threadpool(run)
        return self.console.page(
            "dev_outcome.html",
            title=f"save {line(name)}",
            what={"saved": "saved", "submitted": "build submitted", "steps": "not saved (what to do instead)"}.get(
                outcome.kind, outcome.kind
            ),
            session=line(name),
            lines=[line(text) for text in outcome.lines],
        )


def _starting_view(s: Starting) -> dict[str, Any]:
    return {"scheduler": s.scheduler, "steps": list(s.steps), "lines": list(s.lines), "error": s.error, "done": s.done}
