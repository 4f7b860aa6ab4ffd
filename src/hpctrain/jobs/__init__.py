"""The scheduler-neutral job description: what runs (command, environment/image), on what (resources per node or
pod), for how long and with which restart budgets. spec.py holds the typed JobSpec and its validation, values.py the
textual forms of its values (time, memory, gres), mapping.py builds it from plain data; file_reading.py reads job
files (YAML, TOML) safely; hpctrain.schedulers.job_sections splits off a backend's section.

Scheduler-specific options live in each backend, which checks them and the JobSpec against its own forms:
SlurmOptions (partition, account, qos, output/error, extra #SBATCH options, launcher, requeue budgets) and
KubernetesOptions (namespace, image, volumes, ...). A backend refuses what it cannot express (the environment kinds
other than none on Kubernetes, shards, a GPU type), with its own way.
"""

from hpctrain.jobs.file_reading import load_job_file
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import EnvironmentSpec, JobSpec, Resources

__all__ = ["EnvironmentSpec", "JobSpec", "Resources", "from_mapping", "load_job_file"]
