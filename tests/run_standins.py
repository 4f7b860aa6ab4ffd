"""TEST-ONLY: run the Kubeflow controller stand-ins of hpctrain's tests (tests/kubeflow_standin.py for PyTorchJobs,
tests/trainer_standin.py for TrainJobs) in one namespace of the LOCAL test cluster with a node, so that jobs
submitted there get pods, as a test gets them:

    python tests/run_standins.py --context hpctrain-node --namespace default

They are not Kubeflow: they play the controllers just enough for hpctrain's tests (docs/kubernetes.md, "Still
stand-ins") and run only against an API server on this machine (127.0.0.1); any other context is refused. Ctrl-C
(or SIGTERM) stops them; what they could not do is printed as it happens.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from urllib.parse import urlparse


# What the stand-ins import as they check a job (tests/kubeflow_oracle.py, kubeflow_crds.py): the distribution
# that provides each module (pyproject.toml: `k8s` and `dev` extras).
NEEDED = {"kubernetes": "kubernetes", "yaml": "PyYAML", "jsonschema": "jsonschema", "celpy": "cel-python"}


def missing_modules() -> list[str]:
    """The distributions of NEEDED whose module does not import here."""
    import importlib

    missing = []
    for module, distribution in NEEDED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/run_standins.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", default="hpctrain-node", help="kubeconfig context (default: hpctrain-node)")
    parser.add_argument("--namespace", default="default", help="namespace whose jobs get pods (default: default)")
    args = parser.parse_args(argv)
    missing = missing_modules()
    if missing:
        print(
            f"run_standins: the stand-ins need {', '.join(missing)}, not installed here (they check every job as "
            "Kubeflow's webhooks and CRD rules would): pip install -e '.[k8s,dev]'",
            file=sys.stderr,
        )
        return 2
    from kubernetes import config

    from trainer_standin import TrainerStandIn

    try:
        api = config.new_client_from_config(context=args.context)
    except Exception as err:  # the kubeconfig's own complaint, in one line
        print(f"run_standins: cannot load context {args.context!r}: {err}", file=sys.stderr)
        return 2
    host = urlparse(api.configuration.host).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"run_standins: context {args.context!r} points at {host}, not at a local test cluster: the stand-ins "
            "are for scripts/local-k8s.sh's clusters only",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    standins = TrainerStandIn(api, args.namespace).start()
    print(
        f"run_standins: TEST-ONLY stand-ins of the Kubeflow PyTorchJob and TrainJob controllers running in "
        f"namespace {args.namespace} of context {args.context}; Ctrl-C stops them",
        flush=True,
    )
    said = 0
    while not stop.wait(1.0):
        for line in standins.errors[said:]:
            print(f"run_standins: {line}", file=sys.stderr, flush=True)
        said = len(standins.errors)
    standins.stop()
    print("run_standins: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
