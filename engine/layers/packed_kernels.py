"""Which kernel runs the packed weight copies of the CPU's few-row steps (a k+1-row verify, the draft's glue pass),
for which row counts.

For one row MKL runs a GEMV that streams the weights at the memory bound. For 2-8 rows its GEMM first packs
the weight into its own panel layout, on every call: that copy is most of why a 5-row verify of SmolLM2-135M
cost 1.5x a one-row step on one core. Packing each weight once at load time removes the copy. Two kernels:

"mkl" (``cblas_sgemm_pack`` / ``cblas_sgemm_compute`` through ``torch.ops.mkl``), on Intel CPUs. Measured on a
2-core AVX-512 Intel box, SmolLM2-135M's matmuls on one core (ms, plain K-major GEMM / packed):

    rows    1      2      3      4      5      6      7      8      10     16
            36/-   45/40  47/45  52/47  56/51  61/52  65/57  71/56  79/86  86/97

so only 2..8 rows take it there. Its products are the K-major GEMM's, bit for bit (the same kernel, minus the
copy): `pack_weights` checks this once per weight shape and packs nothing where it does not hold.

"onednn" (``torch.ops.mkldnn``'s packed linear), on every other CPU: MKL takes slow generic paths for small
GEMMs on AMD. Measured on a 2-core AMD EPYC (Zen 3, AVX2), the same matmuls, weights flushed from the cache by
the step before (ms, plain K-major GEMM / oneDNN packed):

    rows        1       2        4        5        8        16       32
    1 thread    49/89   92/94    181/94   198/101  199/103  241/147  310/210
    2 threads   44/44   73/46    173/53   120/51   133/63   146/83   190/115

so 2..32 rows take it there. On a 2-core AMD EPYC with AVX-512 (Zen 4) oneDNN also wins at one row, without
flushing (ms, the same matmuls, 1 thread; 2 threads alike):

    rows        1          2          3          5          8
    1 thread    25.4/18.6  41.0/18.3  51.1/19.6  56.5/21.1  59.7/26.1

and it stays about twice as fast for many rows (a batch's decode steps, prefill; ms, 1 thread):

    rows                      64         256        1024
    [3072, 576] (gate-up)     3.3/1.5    10.0/4.6   40.3/17.1
    [49152, 576] (the head)   58.3/17.9  191/99     727/358

so there every step takes it, whatever its rows (`one_row_pays`: a non-Intel CPU with AVX-512; `max_rows`),
and an engine packs even for AR alone, where one-row steps are all its decoding. Its products differ from MKL's
GEMM in rounding, as a GEMM of any other row count does (`pack_weights` checks they agree to float32 rounding);
greedy SD/SSD stay token-identical to AR (tested).

"panel" (our own kernel, engine.layers.panel), on every CPU with AVX-512, AVX2 or NEON where it builds: weights
as 32-column panels, every output one FMA chain over k whatever the row count, so one-row steps and a verify
get the same bits, and 1-32 rows cost about one row's time (the table there). It takes every step of 1-32 rows
(one-row steps too: the same kernel keeps AR's and a verify's products identical), and so an engine packs even
for AR alone; more rows (prefill) run MKL's GEMM on Intel and the panel kernel elsewhere. On a 2-core AMD EPYC
with AVX-512 (Zen 4, another VM than the oneDNN table's), SmolLM2-135M's matmuls, 1 thread (ms, K-major MKL GEMM
/ MKL-packed / oneDNN-packed / panel; `python scripts/matmul_rows.py`, 2026-12-04):

    rows     1                      2                      5                      16
             31.0/31.5/36.6/23.2    46.6/48.6/43.9/23.5    78.1/72.1/29.2/24.1    104.8/94.8/54.5/47.6

and with the other core busy (so slower throughout), many rows: 64 313/308/216/203, 256 985/1218/985/899. The
panel kernel wins at every row count there, where oneDNN was taken before; on Intel MKL's GEMM wins past 32 rows
(the panel table).

"panel4" (the default where "panel" builds): the panel kernel on 4-bit copies of the weights that are 4-bit
values already (engine.layers.panel4: SmolLM2-135M's layers are its GGUF's Q4_1 values stored as float32), the
same bits for a fifth of the bytes, and on 8-bit copies of the weights that are 8-bit values (engine.layers.panel8:
its tied embedding and head, Q8_0), the same bits for 28% of the bytes; every other weight keeps its float32
panels. `same_products` also checks a low-bit copy against the float32 panels, bit for bit.

"q8" (opt-in, an x86 CPU with AVX2; AVX-512 VNNI where it has it, the same bits): panel4's copies, the 4-bit
layers' products computed with their activations rounded to 8 bits per 32 inputs (engine/kernels/q8_gemm.cpp,
llama.cpp's Q4_1 x Q8 arithmetic): integer dot products, about 1.5x as fast as panel4 for one row, but not the float32
model's bits (about 0.6% of a product's size off; greedy SD/SSD stay token-identical to AR under it: each row's
products are still the same bits at any row count). The 8-bit head takes the same arithmetic (panel8's copies);
every other weight runs as under panel4 (float32 panels, the same bits).

This module decides which kernel runs which row counts on this CPU; engine.layers.packed makes the copies and runs them.
"""

from __future__ import annotations

import platform

import torch

from engine import cpu_info
from engine.config import CPU_MATMULS
from engine.layers import native, panel

KERNELS = CPU_MATMULS  # panel4: panel, with 4-bit copies of 4-bit weights (panel4.py)
# rows beyond these run faster on the plain GEMM (tables above)
MAX_ROWS = {"mkl": 8, "onednn": 32, "panel": 32, "panel4": 32, "q8": 32}
EVERY_STEP = 1 << 40  # max_rows where the packed copy wins at every row count


def default_kernel() -> str:
    """"panel4" (the panel kernel, on 4-bit copies of the weights that are 4-bit values) on a CPU with AVX-512,
    AVX2 or NEON where our kernel builds, else "mkl" on Intel, "onednn" on any other CPU (the tables above)."""
    if _panel_available():  # AVX-512, AVX2 + FMA or NEON, and a C++ compiler
        return "panel4"
    return "mkl" if _cpu_vendor() == "GenuineIntel" else "onednn"


def resolve_kernel(kernel: str = "auto") -> str:
    """`kernel`, with "auto" replaced by `default_kernel()`."""
    return default_kernel() if kernel == "auto" else kernel


def family(kernel: str) -> str:
    """The kernel `kernel` runs on: "panel" for "panel4" and "q8" (the panel kernels, on 4-bit copies where they
    are exact; q8's copies say so themselves: Panel4.q8)."""
    kernel = resolve_kernel(kernel)
    return "panel" if kernel in ("panel4", "q8") else kernel


def one_row_pays(kernel: str = "auto") -> bool:
    """Whether one-row steps take the packed copy too: the panel kernel always (one kernel for every few-row
    step keeps their products identical), oneDNN on a non-Intel CPU with AVX-512 (the tables above: faster
    there at one row, slower on AVX2 only)."""
    kernel = family(kernel)
    if kernel == "panel":
        return True
    return kernel == "onednn" and _cpu_vendor() != "GenuineIntel" and _has_avx512()


def min_rows(kernel: str) -> int:
    """The fewest rows a step has to take the packed copy for `kernel` (a one-row step is a GEMV elsewhere)."""
    return 1 if one_row_pays(kernel) else 2


def max_rows(kernel: str) -> int:
    """The most rows a step may have to take the packed copy for `kernel`: every step where it beats MKL's GEMM
    at any row count (oneDNN where one row already gains, the panel kernel off Intel: the tables above), else
    `MAX_ROWS`."""
    kernel = family(kernel)
    if (kernel == "onednn" and one_row_pays(kernel)) or (kernel == "panel" and _cpu_vendor() != "GenuineIntel"):
        return EVERY_STEP
    return MAX_ROWS[kernel]


def _has_avx512() -> bool:
    return "avx512f" in cpu_info.flags()


def _cpu_vendor() -> str:
    return cpu_info.field("vendor_id") or platform.processor()


def _panel_available() -> bool:
    return panel.available()


def available(kernel: str = "mkl") -> bool:
    if kernel == "q8":
        return _panel_available() and native.q8_available()
    if family(kernel) == "panel":
        return _panel_available()
    if not torch.backends.mkldnn.is_available():
        return False
    if kernel == "mkl":
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    return hasattr(torch.ops.mkldnn, "_linear_pointwise")
