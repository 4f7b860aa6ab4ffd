"""The pages and endpoints of the console (Starlette), behind hpctrain.web.guard.

    GET  /                         the jobs of every scheduler: a table each, searchable and sortable, live
    GET  /api/jobs                 the same as JSON (hpctrain.web.board's shared snapshot), polled by the page; an
                                   ETag: a page whose table did not change gets 304, nothing built or sent
    GET  /job/SCHEDULER/JOB        a job: its status view (kept current), and its log followed live
    GET  /api/job/SCHEDULER/JOB    that status view as JSON, polled by the page
    GET  /api/log/SCHEDULER/JOB    that log as server-sent events (hpctrain.web.follow)
    POST /job/SCHEDULER/JOB/stop   cancel the job (a form with the CSRF token, confirmed on the page)
    GET  /cluster                  each scheduler's cluster view (its tables from /api/cluster), "does my job fit"
    GET  /api/cluster              the cluster views as JSON (versioned: 304 when unchanged)
    GET  /dev, POST /dev/...       dev sessions: list, start, stop, save (hpctrain.web.dev_pages)
    GET  /jobs/new[?from=S/JOB]    the job form (hpctrain.web.job_form), empty or filled with JOB's description
    POST /jobs/new                 Check, Preview or Submit what the form holds (hpctrain.engine.submission)
    GET  /static/...               our script and style sheet

What the schedulers say is asked through hpctrain.web.board: once per interval for all pages. Every page is a
Jinja2 template with autoescape, fed with hpctrain.web.safeview' visible-safe data; pages change
nothing on GET and run no shell: they call the schedulers' interface only. A UserError (an unknown job, a scheduler
that cannot answer) is its one line on the page, as the CLI says it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hpctrain import __version__
from hpctrain.engine import submission
from hpctrain.errors import UserError, redact
from hpctrain.schedulers.base import JobNotFound, Scheduler
from hpctrain.web import fit, follow, job_form
from hpctrain.web.board import Board, Versioned
from hpctrain.web.dev_pages import DevPages
from hpctrain.web.guard import CSRF_FIELD, Guard, Secrets
from hpctrain.web.jobroutes import JobRoutes
from hpctrain.web.safeview import job_data, line, view_parts

HERE = Path(__file__).resolve().parent
STOP_WAIT_S = 10.0


def templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every {{ value }} HTML-escaped, in every template whatever its name
        undefined=jinja2.StrictUndefined,
    )


class Console:
    """The console's state: the schedulers (or why each cannot be used), the shared jobs board, the secrets."""

    def __init__(
        self,
        schedulers: Mapping[str, Scheduler | UserError],
        keys: Secrets,
        interval_s: float,
        all_users: bool = False,
    ) -> None:
        self.schedulers = dict(schedulers)
        self.keys = keys
        self.board = Board(self.schedulers, interval_s, all_users=all_users)
        self.env = templates()
        self.job_flags = job_form.parser_for(list(self.schedulers))  # the job form's fields: these backends' too
        self.job_routes = JobRoutes(self)

    def scheduler(self, name: str) -> Scheduler:
        found = self.schedulers.get(name)
        if found is None:
            raise JobNotFound(f"no scheduler {name!r} in this console: it shows {', '.join(self.schedulers)}")
        if isinstance(found, UserError):
            raise found
        return found

    def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(
            csrf=self.keys.csrf, csrf_field=CSRF_FIELD, version=__version__, schedulers=list(self.schedulers), **context
        )
        return HTMLResponse(html, status_code=status)

    # ---- pages ----------------------------------------------------------------------------------------------

    async def jobs_page(self, request: Request) -> Response:
        return self.page("jobs.html", title="jobs", interval_s=self.board.interval_s)

    def jobs_json(self, request: Request) -> Response:
        return versioned(request, self.board.snapshot())

    def cluster_json(self, request: Request) -> Response:
        """Each scheduler's cluster view as JSON (its node table drawn by the page a page at a time), kept as JSON
        text with the board's entry: once per interval for all pages, and a 304 for a page that has it."""
        return versioned(request, self.board.get(("cluster",), lambda: Versioned(self._cluster()), costly=True))

    def _cluster(self) -> dict[str, Any]:
        sections = []
        for name in self.schedulers:
            try:
                sections.append({"name": name, "parts": view_parts(self.scheduler(name).cluster_view()), "error": None})
            except UserError as err:
                sections.append({"name": name, "parts": [], "error": line(str(err))})
        return {"schedulers": sections}

    def job_view(self, name: str, job_id: str) -> dict[str, Any]:
        """The job's view as its page shows it, {"parts", "ended"}: asked once per interval for every page and
        every follower of its log."""
        scheduler = self.scheduler(name)
        return self.board.get(("job", name, job_id), lambda: job_data(scheduler.status_view(job_id)))

    def job_ended(self, name: str, job_id: str) -> bool:
        """Whether the job has ended, as its shared view says (a job the scheduler no longer knows has); how its
        followed log learns that it ends, asking the scheduler nothing of its own."""
        try:
            return bool(self.job_view(name, job_id)["ended"])
        except JobNotFound:
            return True

    def job_page(self, request: Request) -> Response:
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        parts = self.job_view(name, job_id)["parts"]
        return self.page(
            "job.html",
            title=f"job {line(job_id)}",
            scheduler=name,
            job_id=line(job_id),
            parts=parts,
            interval_s=self.board.interval_s,
            log_stream="stderr" if request.query_params.get("stream") == "stderr" else "stdout",
            log_replica=request.query_params.get("replica"),
            **self.job_routes.context(name, job_id),
        )

    def job_json(self, request: Request) -> Response:
        return JSONResponse(self.job_view(request.path_params["scheduler"], request.path_params["job"]))

    async def log_events(self, request: Request) -> Response:
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        stream = "stderr" if request.query_params.get("stream") == "stderr" else "stdout"
        follower = follow.start(
            self.scheduler(name),
            job_id,
            stream,
            request.query_params.get("replica"),
            ended=lambda: self.job_ended(name, job_id),
        )
        return StreamingResponse(follow.events(follower), media_type="text/event-stream")

    def stop_job(self, request: Request) -> Response:
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        outcome = self.scheduler(name).cancel_and_wait(job_id, wait_s=STOP_WAIT_S)
        return self.page(
            "outcome.html",
            title=f"stop {line(job_id)}",
            scheduler=name,
            job_id=line(job_id),
            lines=[line(text) for text in outcome.lines],
            failed=outcome.exit_code != 0,
        )

    def cluster_page(self, request: Request) -> Response:
        """The fit form and its answers; the nodes come from /api/cluster (drawn by the page's script)."""
        values = fit.asked(request.query_params)
        sections = []
        for name in self.schedulers:
            fits = None
            if values is not None:
                try:
                    fits = fit.answer(self.scheduler(name), values)
                except UserError as err:
                    fits = {"fits": False, "lines": [line(str(err))]}
            sections.append({"name": name, "fit": fits})
        form = [(key, label, (values or {}).get(key, default)) for key, label, default in fit.FIELDS]
        return self.page("cluster.html", title="cluster", sections=sections, form=form)

    # ---- the job form ---------------------------------------------------------------------------------------

    def new_job_page(self, request: Request) -> Response:
        """The form, empty (the console's first scheduler chosen) or, with ?from=SCHEDULER/JOB, holding that job's
        recorded description."""
        clone = request.query_params.get("from")
        if clone:
            name, _, job_id = clone.partition("/")
            scheduler = self.scheduler(name)
            form = job_form.from_record(submission.recorded(scheduler, job_id), scheduler.connection())
            return self.form_page(form, note=f"the description job {line(job_id)} was submitted with")
        name = next(iter(self.schedulers), "")
        found = self.schedulers.get(name)
        form = job_form.new_form(name, {} if isinstance(found, UserError) or found is None else found.connection())
        return self.form_page(form)

    async def new_job(self, request: Request) -> Response:
        """Check, Preview or Submit: the form again with the problems beside their fields or the script, or, once
        submitted, the new job's page. Bad input is its one line on the page, and nothing is sent."""
        from urllib.parse import parse_qs

        fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
        form = job_form.FormInput.from_form(fields, self.job_flags)
        action = (fields.get("action") or ["check"])[-1]
        # the checks and sbatch wait on the scheduler: off the event loop, as the other pages' work is
        return await run_in_threadpool(self.act_on_form, form, action)

    def act_on_form(self, form: job_form.FormInput, action: str) -> Response:
        try:
            if action not in job_form.ACTIONS:
                raise UserError(f"unknown action {action!r}: use {', '.join(job_form.ACTIONS)}")
            job = form.job(self.job_flags)
            backend = job.backend()
            # where the console shows this scheduler's jobs, and nowhere else (its page would not find the job)
            away = job_form.elsewhere(
                job.scheduler, backend.connection(), self.scheduler(job.scheduler).connection(), self.job_flags
            )
            if away:
                raise UserError(away)
            rendered = submission.preview(job, backend)
            if action == "preview":
                return self.form_page(form, rendered=redact(rendered.preview or rendered.text))
            problems = submission.check(job, backend=backend, rendered=rendered)
            if action == "check" or any(p.blocking for p in problems):
                return self.form_page(form, problems=problems, checked=True, status=200 if action == "check" else 400)
            done = submission.submit(job, problems, backend=backend, rendered=rendered)
        except UserError as err:
            return self.form_page(form, error=line(str(err)), status=400)
        return RedirectResponse(f"/job/{quote(done.scheduler, safe='')}/{quote(done.job_id, safe='')}", 303)

    def form_page(
        self,
        form: job_form.FormInput,
        problems: list[submission.Problem] | None = None,
        checked: bool = False,
        rendered: str | None = None,
        error: str | None = None,
        note: str | None = None,
        status: int = 200,
    ) -> HTMLResponse:
        beside, rest = job_form.problems_by_field(problems or [], self.job_flags)
        return self.page(
            "job_form.html",
            status=status,
            title="new job",
            form=form,
            groups=job_form.groups(self.job_flags),
            recipes=list(job_form.CATALOG),
            beside={k: [_problem(p) for p in v] for k, v in beside.items()},
            rest=[_problem(p) for p in rest],
            checked=checked,
            fits=checked and not any(p.blocking for p in problems or []),
            rendered=rendered,
            error=error,
            note=note,
        )

    async def user_error(self, request: Request, exc: Exception) -> Response:
        status = 404 if isinstance(exc, JobNotFound) else 400
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": line(str(exc))}, status_code=status)
        return self.page("error.html", status=status, title="error", message=line(str(exc)))


def versioned(request: Request, value: Versioned) -> Response:
    """The JSON text, or 304 (nothing sent) when the page has this version already (If-None-Match)."""
    headers = {"ETag": value.etag, "Cache-Control": "no-cache"}
    if value.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(value.body, media_type="application/json", headers=headers)


def _problem(p: submission.Problem) -> dict[str, Any]:
    return {"line": line(p.line), "fix": line(p.fix), "kind": p.kind}


def create_app(
    schedulers: Mapping[str, Scheduler | UserError], keys: Secrets, interval_s: float = 5.0, all_users: bool = False
) -> Starlette:
    """The console's ASGI application: the pages, behind the Guard; `all_users`: everyone's jobs in the table, where
    a scheduler tells them apart (`hpctrain status --all-users`)."""
    console = Console(schedulers, keys, interval_s, all_users)
    routes = [
        Route("/", console.jobs_page),
        Route("/api/jobs", console.jobs_json),
        Route("/job/{scheduler}/{job}", console.job_page),
        Route("/job/{scheduler}/{job}/stop", console.stop_job, methods=["POST"]),
        Route("/api/job/{scheduler}/{job}", console.job_json),
        Route("/api/log/{scheduler}/{job}", console.log_events),
        Route("/cluster", console.cluster_page),
        Route("/api/cluster", console.cluster_json),
        *DevPages(console).routes(),
        Route("/jobs/new", console.new_job_page),
        Route("/jobs/new", console.new_job, methods=["POST"]),
        *console.job_routes.routes(),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, keys=keys)],
        exception_handlers={UserError: console.user_error},
    )
    app.state.console = console
    return app
