"""The scheduler-neutral job description: only what every scheduler means the same way (the command, nodes and
what each needs, memory in bytes, the time limit in seconds, the run directory, the restart budget, environment
variables, the name, the nodes to avoid). spec.py holds the typed JobSpec and its validation, values.py reads the
forms people type (a time limit, a memory size) into numbers, mapping.py builds a JobSpec from plain data;
file_reading.py reads job files (YAML, TOML) safely; hpctrain.schedulers.job_sections splits off a backend's
section.

Each backend keeps its own typed options part and checks them and the JobSpec against its own forms: SlurmOptions
(partition, account, qos, GPU type, shards, the software environment, the interpreter, launcher, requeue and
hang-restart budgets) and KubernetesOptions (namespace, image, volumes, /dev/shm, selectors, tolerations, priority
class, API kind). Nothing here imports a backend or names a scheduler's own grammar.
"""

from hpctrain.jobs.file_reading import load_job_file
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import JobSpec, Resources

__all__ = ["JobSpec", "Resources", "from_mapping", "load_job_file"]
