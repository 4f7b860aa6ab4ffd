"""The scheduler-neutral job description: what runs (command, environment/image), on what (resources per node or
pod), for how long and with which restart budgets. spec.py holds the typed JobSpec and its validation, values.py the
Slurm forms of its values (time, memory, gres, #SBATCH options), mapping.py builds it from plain data; file.py
reads job files (YAML, TOML) safely; hpctrain.schedulers.job_sections splits off a backend's section.

A few JobSpec fields only mean something to Slurm (partition, account, qos, output/error, sbatch_extra, launcher,
the environment kinds other than none, requeue budgets); the Kubernetes backend refuses those it cannot express,
with the Kubernetes way. Scheduler-specific options (a Kubernetes namespace, volumes) live in each backend.
"""

from hpctrain.jobs.file_reading import load_job_file
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import EnvironmentSpec, JobSpec, Resources

__all__ = ["EnvironmentSpec", "JobSpec", "Resources", "from_mapping", "load_job_file"]
