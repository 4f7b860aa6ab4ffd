"""Unit tests of hpctrain.distributed.failures: which errors count as a vanished peer, and where they are marked.

The end-to-end cases (a real rank frozen before each collective under torchrun) are in test_worker_failures.py."""

from __future__ import annotations

import pytest

from hpctrain.distributed.failures import PeerLost, collective, looks_like_peer_failure, peer_failures
from hpctrain.distributed.environment import DistEnv

# Texts as the backends raise them (gloo's tcp transport, torch's ProcessGroupNCCL and TCPStore).
BACKEND_TEXTS = [
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to "
    "complete",
    "Application timeout caused pair closure",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:5467: Connection reset by peer",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:339] writev [127.0.0.1]:5467: Broken pipe",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600032 milliseconds before timing out.",
    "NCCL communicator was aborted on rank 1.",
    "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version "
    "2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely.",
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?",
]


@pytest.mark.parametrize("text", BACKEND_TEXTS, ids=range(len(BACKEND_TEXTS)))
def test_backend_texts_read_as_a_vanished_peer(text):
    assert looks_like_peer_failure(RuntimeError(text))


def test_a_bug_does_not_read_as_a_vanished_peer():
    assert not looks_like_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"))
    assert not looks_like_peer_failure(ValueError("Expected more than 1 value per channel when training"))


def test_any_error_inside_a_pure_collective_is_a_peer_failure():
    with pytest.raises(PeerLost) as caught, collective("the stop vote after step 3"):
        raise RuntimeError("some words no backend has used yet")
    assert caught.value.what == "the stop vote after step 3"


def test_only_known_keeps_a_bug_as_it_is():
    with pytest.raises(ValueError), collective("step 1's gradient all-reduce (backward)", only_known=True):
        raise ValueError("a bug in the model")
    with pytest.raises(PeerLost), collective("step 1's gradient all-reduce (backward)", only_known=True):
        raise RuntimeError("Application timeout caused pair closure")


def test_a_single_process_keeps_its_own_error():
    single = DistEnv(
        launcher="none",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=None,
        master_port=None,
        init_method=None,
    )
    with pytest.raises(RuntimeError, match="Timed out"), peer_failures(single, 5.0):
        raise RuntimeError("Timed out doing something local")
