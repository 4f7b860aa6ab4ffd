"""What the services around a job run and show, whatever the scheduler: the servers of interactive development
sessions (JupyterLab, an sshd of the user's own, a VS Code tunnel), TensorBoard, and `top`'s per-node probe. How each
runs on a cluster (a Slurm batch job, a pod) is the scheduler's: schedulers/slurm/services/service_jobs.py and
schedulers/kubernetes/services/service_pods.py build on these modules, and the CLI reaches them through
`get_scheduler(name).services()` (hpctrain.schedulers.service_api.Services), never by name.

    common.py      state directories (0700) and private files (0600), HTTP/TCP readiness probes, the ssh -L tunnel
    sessions.py    DevConfig, session names, the state folder and its files, SessionView, the start lock
    jupyter.py     JupyterLab: its command, readiness and idle time (Jupyter's /api/status)
    ssh.py         sshd: the user's public key, a host key per session, sshd_config, the ~/.ssh/config block
    code.py        VS Code tunnel: its command, its name, its device-login line and URL in the job's output
    tensorboard.py TensorBoard here (127.0.0.1), and what one on the cluster needs: --logdir_spec, readiness
    top.py         `hpctrain top`: the probe script, what it prints parsed, and the screen made of it

State lives in HPCTRAIN_HOME/dev/NAME (0700): `token` and `connection.json` (0600), the batch script, the job's
output, and `endpoint.json` written by the job. The token is made here (secrets.token_urlsafe), read by the job
from its 0600 file into JUPYTER_TOKEN, and never appears on a command line.
"""
