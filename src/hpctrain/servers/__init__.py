"""Interactive development sessions: JupyterLab, an sshd of the user's own, or a VS Code tunnel on a compute node
(JupyterLab also in a pod), reached through a tunnel. One module per service, one per backend:

    config.py      DevConfig, session names, the state folder and its files, SessionView (neutral)
    jupyter.py     JupyterLab: its command, readiness and idle time (Jupyter's /api/status)
    ssh.py         sshd: the user's public key, a host key per session, sshd_config, the ~/.ssh/config block
    code.py        VS Code tunnel: its command, its name, its device-login line and URL in the job's output
    slurm.py       a session as a Slurm job (all three services): render, start, view, stop
    kubernetes.py  a session as a pod (JupyterLab): render, start, view, stop

    cfg = DevConfig("explore", resources=Resources(cpus_per_task=4, gpus_per_node=1), environment=EnvironmentSpec("venv", venv="~/t"))
    script = slurm.render_dev_script(cfg, state_dir)    # pure: what `hpctrain dev start --dry-run` prints
    conn = slurm.start(cfg, ...)                        # submit, wait until the server answers with the token
    view = slurm.view(state_dir, conn, probe=True)      # state, age, idle time from Jupyter's /api/status
    slurm.stop(state_dir, conn)                         # scancel (or delete the pod): the node is free again

The CLI reaches these through the backend's services (hpctrain.around.services_for), never by name.

State lives in HPCTRAIN_HOME/dev/NAME (0700): `token` and `connection.json` (0600), the batch script, the job's
output, and `endpoint.json` written by the job. The token is made here (secrets.token_urlsafe), read by the job
from its 0600 file into JUPYTER_TOKEN, and never appears on a command line.
"""
