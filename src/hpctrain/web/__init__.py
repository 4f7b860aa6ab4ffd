"""The web console (`hpctrain web`, the `web` extra): the CLI's other face, over the same engine functions.

Pages read what the schedulers' interface returns (hpctrain.schedulers: `status_view`, `cluster_view`, `logs`,
`cancel_and_wait`) and what the engine returns (hpctrain.engine.submission: the job form's build, check, preview,
submit), and know no scheduler. The modules, in the order a request meets them:

    listen   where the console listens: a Unix socket in a directory only the user can read, or 127.0.0.1:PORT
    guard    the security rules every request passes: Host, token and cookie, CSRF and origin, the headers
    app      the pages and endpoints (Starlette), rendered by Jinja2 templates with autoescape
    board    what the pages show (jobs, a job, the cluster), asked once per interval for all open pages
    safeview a View made into what a page shows: every string from outside made visible (hpctrain.safetext)
    follow   a job's log followed live, to the page as server-sent events
    job_form the job form's fields, made from `hpctrain submit`'s job flags, and what was typed made into them

The assets (static/) are ours and ship in the package: compute clusters are offline, no CDN is reached.
docs/web.md describes the security model.
"""
