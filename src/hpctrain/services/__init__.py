"""Network services on the cluster: a server process (JupyterLab, sshd, TensorBoard) in a Slurm job or a
Kubernetes pod, its connection details kept private in a state directory, and the command that reaches it.

Dev sessions (hpctrain.sessions) and the cluster TensorBoard (hpctrain.around) are built on this package:
  * common.py      state directories (0700) and private files (0600), HTTP readiness probes, the tunnel command
  * slurm.py       render_service_script (pure) + submit (thin) + wait_ready (poll the job and the server)
  * kubernetes.py  render_pod (pure) + create/find/delete through the kubernetes client + port-forward command
"""
