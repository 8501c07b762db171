"""Each rank's memory: host RSS now and at its peak, and on CUDA the caching allocator's peaks."""

from __future__ import annotations

import math
import os
import resource

import torch
import torch.distributed as dist

KINDS = ("rss_bytes", "peak_rss_bytes", "cuda_allocated_peak_bytes", "cuda_reserved_peak_bytes")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def this_rank(device: torch.device) -> dict[str, int | None]:
    """This process's figures by ``KINDS``; the CUDA ones None off CUDA. The peak is at least the RSS read with it:
    the kernel's high-water mark is read a moment apart, and other threads (a snapshot's copy) allocate meanwhile."""
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    rss = _current_rss() or peak_rss
    cuda = device.type == "cuda"
    return {"rss_bytes": rss, "peak_rss_bytes": max(peak_rss, rss),
            "cuda_allocated_peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "cuda_reserved_peak_bytes": torch.cuda.max_memory_reserved(device) if cuda else None}


def all_ranks(device: torch.device) -> dict[str, list[int] | None]:
    """Every rank's figures, rank order, by kind (a collective); a kind no rank has is None."""
    figures = this_rank(device)
    mine = [figures[k] for k in KINDS]
    local = torch.tensor([math.nan if v is None else float(v) for v in mine], dtype=torch.float64, device=device)
    rows = [local]
    if dist.is_initialized():
        rows = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, local)
    columns = torch.stack(rows).T.tolist()
    return {kind: None if any(math.isnan(v) for v in values) else [int(v) for v in values]
            for kind, values in zip(KINDS, columns, strict=True)}


def describe(figures: dict[str, int | None]) -> str:
    """One rank's figures (``this_rank``'s) for a console line."""
    rss, peak = figures["rss_bytes"], figures["peak_rss_bytes"]
    allocated, reserved = figures["cuda_allocated_peak_bytes"], figures["cuda_reserved_peak_bytes"]
    assert rss is not None and peak is not None  # the host's figures are always known
    parts = [f"host RSS {_gib(rss)}, peak {_gib(peak)}"]
    if allocated is not None and reserved is not None:  # on CUDA both are known, elsewhere neither
        parts.append(f"CUDA allocated peak {_gib(allocated)}, reserved peak {_gib(reserved)}")
    return "; ".join(parts)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _current_rss() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except OSError:  # not Linux
        return None


def highest(records: list[dict[str, list[int] | None]]) -> dict[str, dict | None] | None:
    """Over records of ``all_ranks``: each kind's largest figure and the rank that had it; None without records."""
    if not records:
        return None
    peaks: dict[str, dict | None] = {}
    for kind in KINDS:
        figures = [(value, rank) for record in records for rank, value in enumerate(record.get(kind) or ())]
        top = max(figures, default=None)
        peaks[kind] = {"max": top[0], "rank": top[1]} if top else None
    return peaks
