"""The job page's own routes and the data it adds to the page (hpctrain.web.jobpage), beside hpctrain.web.app:

    GET  /api/metrics/SCHEDULER/JOB         the plot's points (loss, accuracy, images/s over steps), polled
    POST /job/SCHEDULER/JOB/preempt         rehearse a preemption: what `hpctrain debug preempt JOB` does
    POST /job/SCHEDULER/JOB/tensorboard     start TensorBoard here on the run directory (`hpctrain tensorboard`),
                                            or say the exact command where it cannot
    POST /job/SCHEDULER/JOB/resume          a new job that continues its run directory (engine.submission.resume:
                                            the CLI's resume path, from where the job ran), then the new job's page

The clone button is a link to the job form (/jobs/new?from=SCHEDULER/JOB); stop is app.py's. Every POST passes the
guard (same origin, CSRF token) first; what the run directory and the schedulers say is asked through the console's
board, once per interval for all pages.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from hpctrain.engine import submission
from hpctrain.errors import UserError
from hpctrain.web import jobpage
from hpctrain.web.safeview import line

PREEMPT_TIMEOUT_S = 60.0
KEEP_RUN_DIRS = 4096  # jobs whose run directory is remembered (it never changes for a job)


def _serve_tensorboard(spec: str) -> tuple[subprocess.Popen[str], str]:
    """servers.tensorboard.serve_local, started from a thread of its own that lives as long as the server: the
    server is made to die with the thread that started it (the kernel's parent-death signal is per thread), and a
    request's worker thread ends when the pool no longer needs it."""
    from hpctrain.servers import tensorboard as tbserver

    result: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        try:
            result["server"] = tbserver.serve_local(spec, None)
        except (UserError, OSError) as err:
            result["error"] = err
        finally:
            started.set()
        if "server" in result:
            result["server"][0].wait()

    threading.Thread(target=run, name="tensorboard", daemon=True).start()
    started.wait()
    if "error" in result:
        raise result["error"]
    return result["server"]


def tensorboard_command(directory: Path) -> str:
    return shlex.join(["hpctrain", "tensorboard", str(directory)])


class JobRoutes:
    def __init__(self, console: Any) -> None:  # hpctrain.web.app.Console, which builds these routes (no import back)
        self.console = console
        self._tensorboards: dict[Path, tuple[subprocess.Popen[str], str]] = {}
        self._tensorboard_lock = threading.Lock()
        self._run_dirs: dict[tuple[str, str], Path | None] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/api/metrics/{scheduler}/{job}", self.metrics_json),
            Route("/job/{scheduler}/{job}/preempt", self.preempt, methods=["POST"]),
            Route("/job/{scheduler}/{job}/tensorboard", self.tensorboard, methods=["POST"]),
            Route("/job/{scheduler}/{job}/resume", self.resume, methods=["POST"]),
        ]

    def run_dir(self, name: str, job_id: str) -> Path | None:
        """The job's run directory, asked of the scheduler once per job (a job's batch script or manifest names
        it, and it never changes): the plot's polling asks the scheduler nothing."""
        key = (name, job_id)
        if key not in self._run_dirs:
            scheduler = self.console.scheduler(name)
            found = self.console.board.get(("run_dir", name, job_id), lambda: jobpage.run_dir(scheduler, job_id))
            if len(self._run_dirs) >= KEEP_RUN_DIRS:
                self._run_dirs.pop(next(iter(self._run_dirs)))
            self._run_dirs[key] = found
        return self._run_dirs[key]

    def context(self, name: str, job_id: str) -> dict[str, Any]:
        """What job.html shows beside the status view: the run directory's parts (or why there are none) and how
        to reach the job."""
        scheduler = self.console.scheduler(name)
        board = self.console.board
        try:
            access = board.get(("access", name, job_id), lambda: jobpage.access(scheduler, job_id))
        except UserError as err:
            access = {"shell": None, "replicas": [], "streams": ["stdout"], "error": line(str(err))}
        directory = self.run_dir(name, job_id)
        run = None
        if directory is not None:
            run = board.get(("run", name, job_id), lambda: jobpage.run_parts(directory))
        return {
            "access": access,
            "run": run,
            "tensorboard_command": None if directory is None else tensorboard_command(directory),
        }

    def metrics_json(self, request: Request) -> Response:
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        directory = self.run_dir(name, job_id)
        return JSONResponse(self.console.board.get(("metrics", name, job_id), lambda: jobpage.metrics(directory)))

    def preempt(self, request: Request) -> Response:
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        said: list[str] = []
        outcome = self.console.scheduler(name).preempt(
            job_id, None, False, False, PREEMPT_TIMEOUT_S, say=lambda text: said.append(text)
        )
        return self._outcome("rehearse a preemption of", name, job_id, said + list(outcome.lines), outcome.exit_code)

    def resume(self, request: Request) -> Response:
        """A new job that continues this job's run directory (engine.submission.resume_plan: the CLI's resume path),
        checked and submitted as `hpctrain submit` does it from the directory the job ran in (its relative paths are
        from there, as the page's `cd DIR && hpctrain submit ...` line has it); then the new job's page. What stops
        it (no run directory readable here, no checkpoint, a check that blocks) is its one line on the page, and
        nothing is sent."""
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        self.console.scheduler(name)  # an unknown scheduler: its one line (404)
        try:
            done = submission.resume(submission.resume_plan(self.console.scheduler(name), job_id))
        except UserError as err:
            return self._outcome("resume", name, job_id, [str(err)], 1, status=400)
        return RedirectResponse(f"/job/{quote(done.scheduler, safe='')}/{quote(done.job_id, safe='')}", 303)

    def tensorboard(self, request: Request) -> Response:
        """TensorBoard's own server on 127.0.0.1 of this machine, one per run directory for as long as the console
        runs (it dies with it), as `hpctrain tensorboard RUN_DIR` starts it; where the run directory is not seen
        here, or TensorBoard cannot start, the command that starts it where it can."""
        name, job_id = request.path_params["scheduler"], request.path_params["job"]
        directory = self.run_dir(name, job_id)
        if directory is None:
            command = shlex.join(["hpctrain", "tensorboard", "--on-cluster", "--scheduler", name, "RUN_DIR"])
            lines = [
                f"job {job_id} has no run directory visible from this machine (it was not submitted by `hpctrain "
                f"submit`, or its run directory is on a volume this machine does not mount): start TensorBoard where "
                f"the run directory is, with `{command}` (`hpctrain tensorboard --help`: the volume that holds it)"
            ]
            return self._outcome("TensorBoard for", name, job_id, lines, 1)
        from hpctrain.servers import tensorboard as tbserver

        with self._tensorboard_lock:
            running = self._tensorboards.get(directory)
            if running is None or running[0].poll() is not None:
                try:
                    running = _serve_tensorboard(tbserver.logdir_spec([directory]))
                except (UserError, OSError) as err:
                    command = tensorboard_command(directory)
                    lines = [f"TensorBoard could not start here ({err}); run `{command}` where it is installed"]
                    return self._outcome("TensorBoard for", name, job_id, lines, 1)
                self._tensorboards[directory] = running
        url = running[1]
        port = url.rsplit(":", 1)[1].strip("/")
        lines = [
            f"TensorBoard on {directory}: {url} on this machine (it stops with the console)",
            f"from your laptop: ssh -N -L {port}:127.0.0.1:{port} {socket.gethostname()}, then open {url}",
        ]
        return self._outcome("TensorBoard for", name, job_id, lines, 0, link=url)

    def close(self) -> None:
        """Stop the TensorBoard servers this console started (they also die with the console's process)."""
        with self._tensorboard_lock:
            for process, _ in self._tensorboards.values():
                process.kill()
                process.wait(timeout=30)
            self._tensorboards.clear()

    def _outcome(
        self,
        what: str,
        name: str,
        job_id: str,
        lines: list[str],
        exit_code: int,
        link: str | None = None,
        status: int = 200,
    ) -> Response:
        return self.console.page(
            "outcome.html",
            status=status,
            title=f"{what} {line(job_id)}",
            heading=f"{what[0].upper()}{what[1:]} job",
            scheduler=name,
            job_id=line(job_id),
            lines=[line(text) for text in lines],
            failed=exit_code != 0,
            link=link,
        )
