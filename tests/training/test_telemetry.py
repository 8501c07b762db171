"""MFU's peak lookup and the classification of how an attempt ended."""

from __future__ import annotations

import torch

from training.telemetry import lost_peer, peak_flops


def test_a_collective_broken_by_a_vanished_peer_is_not_an_application_error():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:30417: Connection reset by peer")
    assert lost_peer(gloo)
    assert lost_peer(torch.distributed.DistNetworkError("store unreachable"))
    assert not lost_peer(FloatingPointError("loss is nan at step 7: lower train.lr or check the data"))


def test_peak_flops_is_configured_or_unknown_on_cpu():
    assert peak_flops(989.0, torch.device("cpu")) == 989e12
    assert peak_flops(None, torch.device("cpu")) is None
