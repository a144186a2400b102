"""The machine a benchmark runs on: what it is, and the memory-bandwidth bound of decoding.

One token reads every weight once, so
bound tok/s = (measured streaming bandwidth) / (weight bytes). The bandwidth is measured the way decode
uses memory: a matrix-vector product over a buffer much larger than the caches, on the bench's threads.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch
import transformers

BUFFER_BYTES = 1 << 30  # 1 GiB: several times any CPU's last-level cache (this box has 260 MiB)


def matvec_bandwidth_gb_s(device: str = "cpu", repeats: int = 5) -> float:
    """Best-of-`repeats` bytes/s of torch.mv streaming a 1 GiB fp32 matrix, in GB/s."""
    cols = 1024
    matrix = torch.empty(BUFFER_BYTES // 4 // cols, cols, device=device).normal_()
    vector = torch.ones(cols, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first run only warms up
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mv(matrix, vector)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del matrix
    return BUFFER_BYTES / best / 1e9


def machine_info() -> dict:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
