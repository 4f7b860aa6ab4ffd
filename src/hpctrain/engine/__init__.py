"""The engine under both faces (the CLI, hpctrain.cli, and the web console, hpctrain.web): each command's work as
functions that take typed input and return data, never printing.

    scheduling.py   which scheduler a command talks to (--scheduler, a job file's, this machine's) and each
                    backend's flags for a command's role (BackendInfo.add_arguments)
    job_options.py  the job flags `hpctrain submit` and `hpctrain check` share, and the job they describe with a
                    job file: the neutral JobSpec, the scheduler and that scheduler's options (a Submission)
    submission.py   build, check, preview and submit a job: what `submit`, `check` and the web console's job form
                    call
"""
