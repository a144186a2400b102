"""The panel GEMM: the CPU's few-row matmuls in one kernel of our own (engine/kernels/panel_gemm.cpp), for AVX-512,
AVX2 with FMA or AArch64's NEON (the same source on engine/kernels/simd.h's 16-lane vectors: the same bits on all).

A weight [N, K] is copied once into panels [ceil(N / 32), K, 32] (32 output columns, contiguous over k); the
kernel streams them once per step and computes every output as one FMA chain over k in order, whatever the row
count and the thread count. So a row's products are the same bits in a one-row decode step, a 5-row verify
and a 16-row step: a verify reproduces plain decoding bit for bit in its matmuls, which MKL's GEMV and GEMM do
not (they round differently by row count), and a step of a few rows costs about as much as one row, where MKL
pays about 1.4x for 5 rows even with packed weights. Measured on a 2-vCPU Intel Xeon (AMX VM), SmolLM2-135M's
matmuls (30 layers and the head), one thread, ms per step (`python scripts/matmul_rows.py --rows ...`):

    rows             1     2      3      5      8      16     32     64
    K-major MKL     47.9  135.0  134.5  136.4  145.1  156.4  185.2  235.9
    MKL-packed      54.6   67.7   69.9   79.0   79.6  132.1  229.2  400.7
    oneDNN-packed   68.7   80.6   78.1   81.5   91.3  111.4  160.0  247.9
    panel           45.2   50.1   52.5   56.3   65.6   90.0  147.2  259.1

(this VM's timings move by 10-20% between runs, the order did not). So 1-32 rows take it (packed_kernels.MAX_ROWS);
more rows (prefill) stay on MKL there. On AMD (Zen 4) it beats MKL and oneDNN at every row count, so it takes
every step there (engine.layers.packed_kernels has the table).

The kernel is built and loaded by engine.layers.native (for the instruction set the CPU has). Without it,
`available()` is False and the engine keeps torch's kernels (MKL's or oneDNN's).
"""

from __future__ import annotations

import torch

from engine.layers import native

WIDTH = 32  # output columns per panel (two AVX-512 registers, four AVX2 ones)


def available() -> bool:
    """Whether the panel kernel runs here: a CPU with AVX-512, AVX2 + FMA or NEON, and a kernel that builds and
    loads."""
    return native.library() is not None


def ready() -> bool:
    """`available()`, callable inside a compiled step: the norm and attention kernels' switch. engine.compiled_decode
    marks it `torch.compiler.assume_constant_result` before it compiles (a step asks once, at trace time: it reads
    /proc/cpuinfo); marking it here would import torch._dynamo, about 1 s of every start, compiled or not."""
    return available()


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float32, any strides) -> panels [ceil(N / 32), K, 32], zero rows padding the last one."""
    n, k = weight.shape
    padded = torch.zeros(-(-n // WIDTH) * WIDTH, k, dtype=torch.float32)
    padded[:n] = weight.detach()
    return padded.view(-1, WIDTH, k).transpose(1, 2).contiguous()


def matmul(x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    """x [rows, K] float32 @ the weight the panels hold -> [rows, n]; on torch's thread count."""
    assert panels.shape[1] == x.shape[1] and panels.shape[0] * WIDTH >= n, (x.shape, panels.shape, n)
    return gemm("panel_gemm", x, n, panels)


def gemm(kernel: str, x: torch.Tensor, n: int, *weight: torch.Tensor) -> torch.Tensor:
    """x [rows, K] float32 @ a weight in `kernel`'s layout (its tensors, in the kernel's order) -> [rows, n], on
    torch's thread count: panel_gemm, panel4_gemm and panel8_gemm all take (x, M, K, weight..., y, N, threads)."""
    lib = native.library()
    assert lib is not None, "panel kernel unavailable (check panel.available() first)"
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    getattr(lib, kernel)(x.data_ptr(), rows, k, *(w.data_ptr() for w in weight), y.data_ptr(), n,
                         torch.get_num_threads())
    return y


@torch.library.custom_op("ssd_chat::panel_linear", mutates_args=())
def linear_op(x: torch.Tensor, panels: torch.Tensor, weight: torch.Tensor, max_rows: int) -> torch.Tensor:
    """`matmul` for a compiled step (torch.compile calls it as one opaque op; the graph's row count may be
    symbolic): x [rows, K] -> [rows, N], through the panels for up to max_rows rows, else MKL's GEMM on the
    weight [N, K] (prefill), as the eager path does."""
    if x.shape[0] > max_rows:
        return torch.nn.functional.linear(x, weight)
    return matmul(x, panels, weight.shape[0])


@linear_op.register_fake
def _(x: torch.Tensor, panels: torch.Tensor, weight: torch.Tensor, max_rows: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])
