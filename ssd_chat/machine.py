"""The machine a benchmark runs on: what it is, and the memory-bandwidth bound of decoding.

One token reads every weight once, so
bound tok/s = (measured streaming bandwidth) / (weight bytes). The bandwidth is measured over a buffer much
larger than the caches, on the bench's threads, two ways: a matrix-vector product (the way decode reads the
weights) and a plain sum; the bound takes the faster. On an AMD EPYC MKL's matrix-vector product reads at half
the speed of the sum (20.5 against 39.5 GB/s on one core), and oneDNN's decoding there beats a bound taken
from it; on the Intel box the two agree.
"""

from __future__ import annotations

import os
import platform
import time

import torch
import transformers

from engine import cpu_info

BUFFER_BYTES = 1 << 30  # 1 GiB: several times any CPU's last-level cache (this box has 260 MiB)


def read_bandwidth_gb_s(device: str = "cpu", repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` GB/s of reading a 1 GiB fp32 matrix: {"matvec": torch.mv, "sum": its sum}."""
    cols = 1024
    matrix = torch.empty(BUFFER_BYTES // 4 // cols, cols, device=device).fill_(1.0)  # (every page written: normal_
    # took 2.1 of the 2.8 s this measure took on the 2-vCPU VM, for the same figures)
    vector = torch.ones(cols, device=device)
    kernels = {"matvec": lambda: torch.mv(matrix, vector), "sum": matrix.sum}
    return {name: BUFFER_BYTES / _best_seconds(kernel, device, repeats) / 1e9 for name, kernel in kernels.items()}


def _best_seconds(kernel, device: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats + 1):  # the first run only warms up
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        kernel()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def machine_info() -> dict:
    return {
        "cpu": cpu_info.model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
