"""What the web console's pages cost on a huge Slurm cluster, and what an idle console with three tabs open uses.

A 10,000-node cluster with 100,000 jobs (10,000 of them the caller's) cannot run here: benchmarks/scale_views.py
writes what its Slurm commands print and the stand-ins that answer them (its docstring says how), and this script
adds an answer to `squeue --jobs=ID` (one job's record, the job page's query) from the same generator. A real
`hpctrain web --port` runs as its own process with the stand-ins first on PATH, and a client here asks it:

  page times   each page and JSON endpoint, `cold` (the console's shared board has nothing younger than its
               interval: the scheduler is asked, the answer parsed and rendered) and `warm` (from the board, as every
               other tab in the same interval gets it): the median of --repeat of each, wall time at the client and
               the console's CPU time (its own and its children's, the stand-ins') for the request
  idle CPU     three tabs open for --idle-s seconds as the pages' script keeps them: the jobs page (polls
               /api/jobs every interval, sending back the version it has: 304 while unchanged), a job's page (polls
               /api/job and /api/metrics, follows its log), the cluster page (loaded once); a tab in the background
               asks nothing (document.visibilityState) and closes its log stream. Measured twice: one tab in view
               (the jobs page: three tabs of one window) and all three in view (three windows side by side); with
               --before SRC also a console running the code in SRC (an earlier hpctrain's src/) with its tabs as its
               pages kept them (every tab polling, no versions), side by side in the same run

    python benchmarks/web_pages.py                       # 10,000 nodes, Slurm 22.05's forms
    python benchmarks/web_pages.py --nodes 2500 --repeat 3 --idle-s 30
    python benchmarks/web_pages.py --before /tmp/old/src # and the idle figure of that code beside it
    python benchmarks/web_pages.py --real                # the idle figure on the Slurm found here (no stand-ins)

Needs the web extra and httpx (the dev extra); no Slurm unless --real.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from hpctrain.web.board import COST_SHARE

HERE = Path(__file__).resolve().parent
JOB = "100000"  # the fake cluster's first job (the caller's: scale_views gives every tenth job to the caller)

# squeue --jobs=ID --Format=F:TOKEN,...: one job's fields from scale_views' generator, in the order asked, each
# ended by the query's token; fields the generator has no value for are squeue's empty or N/A.
SQUEUE_ONE = r"""
import os, sys
sys.path.insert(0, {here!r})
import scale_views as s
args = sys.argv[1:]
one = [a for a in args if a.startswith("--jobs=")]
if not one:
    os.execv({generated!r}, [{generated!r}, *args])
job = int(one[0].split("=", 1)[1]) - 100000
fmt = next(a for a in args if a.startswith("--Format="))[len("--Format="):]
values = s.squeue_fields(job, {n}, {me!r}) if 0 <= job < 10 * {n} else None
extra = {{"endtime": "N/A", "exit_code": "0:0", "stdout": "/home/{me}/slurm-%j.out".replace("%j", str(100000 + job)),
          "stderr": "/home/{me}/slurm-%j.out".replace("%j", str(100000 + job))}}
if values is not None:
    cells = []
    for field in fmt.split(","):
        name, _, suffix = field.partition(":")
        cells.append({{**values, **extra}}.get(name.lower(), "N/A") + suffix)
    sys.stdout.write("".join(cells) + "\n")
"""


def cpu_s(pid: int) -> float:
    """The process's CPU seconds, its own and its waited-for children's (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / ticks


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_console(env: dict[str, str], interval_s: float, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    argv = [sys.executable, "-m", "hpctrain", "web", "--port", str(port), "--scheduler", "slurm"]
    process = subprocess.Popen(
        [*argv, "--interval", str(interval_s)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    for _ in range(10):
        found = re.search(r"open: +(http://127\.0\.0\.1:\d+)/\?token=(\S+)", process.stdout.readline())
        if found:
            return process, found.group(0).split("open:", 1)[1].strip()
    process.kill()
    raise SystemExit("the console printed no URL")


def client(url: str) -> httpx.Client:
    base = url.split("/?", 1)[0]
    session = httpx.Client(base_url=base, timeout=300, follow_redirects=False)
    session.get(url[len(base) :])  # the token exchanged for the cookie
    return session


PAGES = {
    "jobs page (/)": "/",
    "jobs JSON (/api/jobs)": "/api/jobs",
    "job page": f"/job/slurm/{JOB}",
    "job JSON": f"/api/job/slurm/{JOB}",
    "job metrics JSON": f"/api/metrics/slurm/{JOB}",
    "cluster page": "/cluster",
    "cluster JSON": "/api/cluster",
}
# What each page asks the board for: the cold request is the first one after the board's entry expired.


def page_times(url: str, pid: int, interval_s: float, repeat: int) -> None:
    session = client(url)
    print(f"{'page':28s} {'cold ms':>9s} {'cold CPU ms':>12s} {'warm ms':>9s} {'warm CPU ms':>12s} {'bytes':>11s}")
    for label, path in PAGES.items():
        cold, cold_cpu, warm, warm_cpu, size = [], [], [], [], 0
        for _ in range(repeat):
            # the board's entries are older than their interval (the board's own, or COST_SHARE times what the last
            # answer took, whichever is longer): the scheduler is asked
            time.sleep(max(interval_s, COST_SHARE * (cold[-1] / 1000 if cold else 0)) + 0.2)
            for times, cpus in ((cold, cold_cpu), (warm, warm_cpu)):
                before = cpu_s(pid)
                start = time.perf_counter()
                answer = session.get(path)
                times.append((time.perf_counter() - start) * 1000)
                cpus.append((cpu_s(pid) - before) * 1000)
                if answer.status_code != 200:
                    raise SystemExit(f"{path}: {answer.status_code} {answer.text[:300]}")
                size = len(answer.content)
        med = statistics.median
        print(f"{label:28s} {med(cold):9.0f} {med(cold_cpu):12.0f} {med(warm):9.0f} {med(warm_cpu):12.0f} {size:11,d}")


def idle_cpu(url: str, pid: int, interval_s: float, seconds: float, job: str, mode: str) -> None:
    """Three tabs as the pages' script keeps them (`mode`: "one in view", "all in view", "before": every tab polling
    without versions, as the pages of --before did); the console's CPU share over `seconds`."""
    stop = threading.Event()
    versions = mode != "before"

    def poll(paths: list[str], in_view: bool) -> None:
        session = client(url)
        for path in paths:  # the page itself and what it asks for at once
            session.get(path)
        etags: dict[str, str] = {}
        while not stop.wait(interval_s):
            if not in_view:
                continue
            for path in paths[1:]:
                headers = {"if-none-match": etags[path]} if versions and path in etags else {}
                answer = session.get(path, headers=headers)
                if "etag" in answer.headers:
                    etags[path] = answer.headers["etag"]

    def follow_log() -> None:
        session = client(url)
        try:
            with session.stream("GET", f"/api/log/slurm/{job}") as answer:
                for _ in answer.iter_lines():
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            pass

    cluster = ["/cluster", "/api/cluster"] if versions else ["/cluster"]
    job_page = [f"/job/slurm/{job}", f"/api/job/slurm/{job}", f"/api/metrics/slurm/{job}"]
    tabs = [
        threading.Thread(target=poll, args=(["/", "/api/jobs"], True), daemon=True),
        threading.Thread(target=poll, args=(job_page, mode != "one in view"), daemon=True),
        threading.Thread(target=poll, args=(cluster[:1], False), daemon=True),  # asked once: no polling
    ]
    if mode != "one in view":  # a job's page in the background closes its log stream
        tabs.append(threading.Thread(target=follow_log, daemon=True))
    if versions:
        tabs.append(threading.Thread(target=lambda: client(url).get(cluster[1]), daemon=True))
    for tab in tabs:
        tab.start()
    time.sleep(interval_s * 2)  # every tab loaded and polling
    before, start = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    used, elapsed = cpu_s(pid) - before, time.monotonic() - start
    stop.set()
    print(
        f"idle console ({mode}), 3 tabs, interval {interval_s:g} s: {used:.2f} CPU s in {elapsed:.0f} s = "
        f"{100 * used / elapsed:.2f}% of one core"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000, help="nodes of the fake cluster (jobs: 10 per node)")
    parser.add_argument("--version", default="22.05", help="the Slurm release whose forms the stand-ins print")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--interval", type=float, default=5.0, help="the console's --interval (default 5, its own)")
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--real", metavar="JOB", help="no stand-ins: the idle figure on this Slurm, JOB's page open")
    parser.add_argument("--before", metavar="SRC", help="also the idle figure of a console running the code in SRC")
    args = parser.parse_args()
    me = getpass.getuser()
    with tempfile.TemporaryDirectory(prefix="hpctrain-web-bench-") as tmp:
        root = Path(tmp)
        env = {**os.environ}
        env.pop("KUBECONFIG", None)
        if args.real is None:
            subprocess.run(
                [sys.executable, str(HERE / "scale_views.py"), "--write", str(root), args.version, str(args.nodes), me],
                check=True,
            )
            data = root / f"{args.version}-{args.nodes}"
            overlay = root / "overlay"
            overlay.mkdir()
            script = overlay / "squeue"
            code = SQUEUE_ONE.format(here=str(HERE), generated=str(data / "bin" / "squeue"), n=args.nodes, me=me)
            script.write_text(f"#!{sys.executable}\n{code}")
            script.chmod(0o755)
            env["PATH"] = os.pathsep.join([str(overlay), str(data / "bin"), env["PATH"]])
            print(
                f"{args.nodes:,} nodes, {10 * args.nodes:,} jobs ({args.nodes:,} of them {me}'s), Slurm "
                f"{args.version}'s forms; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
            )
        if args.before:
            earlier = {**env, "PYTHONPATH": os.pathsep.join([args.before, env.get("PYTHONPATH", "")])}
            process, url = start_console(earlier, args.interval, root)
            try:
                idle_cpu(url, process.pid, args.interval, args.idle_s, args.real or JOB, "before")
            finally:
                process.terminate()
                process.wait(timeout=30)
        process, url = start_console(env, args.interval, root)
        try:
            if args.real is None:
                page_times(url, process.pid, args.interval, args.repeat)
            for mode in ("one in view", "all in view"):
                idle_cpu(url, process.pid, args.interval, args.idle_s, args.real or JOB, mode)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
