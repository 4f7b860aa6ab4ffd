"""`hpctrain logs` on a pod whose container is gone: the kubelet answers the log request with its own line, "unable
to retrieve container logs for containerd://ID" (pkg/kubelet/kuberuntime GetContainerLogs, once the runtime no longer
has the container: the pod was deleted, e.g. by cleanPodPolicy Running as its job failed), which the API server
streams back as if it were the log. Recorded answers (the body as the API server sent it, in the urllib3 response the
kubernetes client returns with _preload_content=False): that line alone is said as a deleted log, not printed as one.
"""

from __future__ import annotations

import io

import pytest

from hpctrain.errors import UserError
from hpctrain.schedulers.kubernetes.api.logstream import log_lines

urllib3 = pytest.importorskip("urllib3")  # the kubernetes client's HTTP library (the k8s extra)

GONE = b"unable to retrieve container logs for containerd://5f1c0a9e2b7d4c3a8e6f0b1d2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4\n"


def answer(body: bytes) -> urllib3.HTTPResponse:
    return urllib3.HTTPResponse(body=io.BytesIO(body), status=200, preload_content=False)


def test_the_kubelets_word_that_the_container_is_gone_is_not_printed_as_the_log() -> None:
    with pytest.raises(UserError) as err:
        list(log_lines(answer(GONE), "mnist-worker-0"))
    message = str(err.value)
    assert message.startswith(
        "the log of pod mnist-worker-0 is gone: the pod was deleted with its container (the "
        "kubelet: unable to retrieve container logs for containerd://5f1c0a9e"
    ), message
    assert "\n" not in message and "`logs -f`" in message


@pytest.mark.parametrize("body", [GONE + b"step 1 loss 2.3\n", b"step 1\n" + GONE, b"", b"hello"])
def test_a_log_that_holds_more_is_printed_as_it_is(body: bytes) -> None:
    assert list(log_lines(answer(body), "mnist-master-0")) == body.decode().splitlines()


@pytest.mark.parametrize(("body", "read"), [(GONE, ["kept 1", "kept 2"]), (b"live 1\n", ["live 1"])])
def test_a_log_that_went_with_its_pod_as_it_was_read_is_the_kept_one(body: bytes, read: list[str]) -> None:
    """`logs JOB --replica R` of a pod that cleanPodPolicy deletes between its listing and its log's first line (the
    kubelet's "unable to retrieve" answer): the log R kept in the run directory, where there is one; a live log as
    it is."""
    from hpctrain.schedulers.kubernetes.queries.live_jobs import _or_kept

    assert list(_or_kept(log_lines(answer(body), "elastic-worker-0"), lambda: iter(["kept 1", "kept 2"]))) == read
