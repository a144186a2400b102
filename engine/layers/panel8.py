"""8-bit copies of weights that are 8-bit values already, for the panel kernel: the same bits, 1.125 bytes a weight.

SmolLM2-135M's tied embedding and LM head is the Q8_0 values of the GGUF file it is converted from: per 32 inputs
of an output column a float16 scale d and a signed byte q, dequantised as d * q in float32. As float32 panels the
head alone was 113 MB of the ~190 MB a decode step read. `compress` recovers a (q, d) that rebuilds a weight
exactly, bit for bit, or says it cannot; the kernel (``panel8_gemm`` in engine/kernels/panel_gemm.cpp) rebuilds
each weight with one product (d * q is exact in float32: an 11-bit mantissa times an 8-bit integer) and runs the
float32 panel kernel's FMA chain, so its outputs are the float32 panel kernel's bits (checked when packing, and
tested). Any weight that is not of that form keeps its float32 panels (engine.layers.packed.pack).

Layout per 32-column panel p: Q [P, K, 32] int8 (column j at byte j), D [P, K / 32, 32] float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers import native, panel
from engine.layers.panel4 import fit_blocks

BLOCK = 32  # inputs per d: Q8_0's block
LIMIT = 127  # Q8_0's q: -127..127 (d = max |w| / 127)


@dataclass(frozen=True)
class Panel8:
    """A weight [n, K] as 8-bit panels (see the module's doc)."""

    q: torch.Tensor  # [n / 32, K, 32] int8
    d: torch.Tensor  # [n / 32, K / 32, 32] float32
    n: int
    q8: bool = False  # products with 8-bit activations (engine/kernels/q8_gemm.cpp, --cpu-matmul q8): not these bits

    @property
    def nbytes(self) -> int:
        """The bytes a step reads: 1.125 a weight."""
        return self.q.numel() * self.q.element_size() + self.d.numel() * self.d.element_size()

    @property
    def kernel(self) -> str:
        """The library's function, which takes `operands` after x."""
        return "panel8q8_gemm" if self.q8 else "panel8_gemm"

    @property
    def operands(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.d

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, K] float32 @ the weight -> [rows, n], on torch's thread count."""
        assert self.q.shape[1] == x.shape[1], (x.shape, self.q.shape)
        return panel.gemm(self.kernel, x, self.n, *self.operands)

    def op(self, x: torch.Tensor, weight: torch.Tensor, max_rows: int) -> torch.Tensor:
        """`matmul` as one opaque op, for a compiled step (panel.linear_op's contract)."""
        return linear_op(x, self.q, self.d, weight, max_rows, self.q8)


def bound_sums(p: Panel8) -> torch.Tensor:
    """Per panel and block of 32 inputs, the largest sum |d * q| over the panel's 32 columns, [P, K / 32]
    (panel8_screened's S): exact in float32, since sum |q| <= 32 * 127 has 12 bits and d (a float16 value) 11."""
    blocks = p.q.shape[1] // BLOCK
    q_abs = p.q.view(p.q.shape[0], blocks, BLOCK, panel.WIDTH).abs().sum(2, dtype=torch.int32)  # [P, B, 32]
    return (p.d * q_abs.float()).amax(-1).contiguous()


def screened(p: Panel8, x: torch.Tensor, sums: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [rows, K] float32 -> (y [rows, n], the (row, panel) pairs computed): `matmul`'s bits in every panel that
    may hold a row's largest product, -inf elsewhere, so that each row's argmax is `matmul`'s (panel8_screened in
    engine/kernels/panel_gemm.cpp: bounds from 8-bit activations, then the float32 kernel where they cannot
    decide). `sums`: bound_sums(p). For greedy steps only: the other products are not computed."""
    assert not p.q8 and p.q.shape[1] == x.shape[1], (x.shape, p.q.shape)
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty(rows, p.n, dtype=torch.float32)
    exact = native.library().panel8_screened(x.data_ptr(), rows, k, p.q.data_ptr(), p.d.data_ptr(),
                                             sums.data_ptr(), y.data_ptr(), p.n, torch.get_num_threads())
    return y, int(exact)


def compress(weight: torch.Tensor) -> Panel8 | None:
    """weight [N, K] float32 -> its 8-bit panels when every block of 32 inputs of every column is d * q (d a
    float16 value, q in -127..127) to the bit, else None."""
    n, k = weight.shape
    if n % panel.WIDTH or k % BLOCK or weight.dtype != torch.float32:
        return None
    w = weight.detach().reshape(-1, BLOCK)  # [N * B, 32]
    fit = fit_blocks(w, (w.abs().amax(-1, keepdim=True) / LIMIT).half(), 0.0, -LIMIT, LIMIT)  # + 0.0: d * q
    if fit is None:
        return None
    d, q = fit
    return from_rows(q.view(n, k).to(torch.int8), d.view(n, k // BLOCK))


def rows(copy: Panel8, ids: torch.Tensor) -> torch.Tensor:
    """ids [N] (long) -> the weight's rows [N, K] float32, the very bits it was compressed from (d * q is exact in
    float32: 11 significant bits times 7): an embedding's lookups from its 8-bit copy (engine.layers.unread)."""
    p, c = ids // panel.WIDTH, ids % panel.WIDTH
    q, d = copy.q[p, :, c], copy.d[p, :, c]  # [N, K] int8, [N, K / 32] float32
    n, k = q.shape
    return (q.float().view(n, k // BLOCK, BLOCK) * d.unsqueeze(-1)).view(n, k)


def from_rows(q: torch.Tensor, d: torch.Tensor, q8: bool = False) -> Panel8:
    """q [N, K] int8 and d [N, K / 32] float32 (a scale per 32 inputs of each output; N, K whole panels and
    blocks) -> their panels."""
    n, k = q.shape
    panels = q.view(n // panel.WIDTH, panel.WIDTH, k).transpose(1, 2).contiguous()  # [P, K, 32]
    per_block = d.view(n // panel.WIDTH, panel.WIDTH, k // BLOCK).transpose(1, 2).contiguous()  # [P, B, 32]
    return Panel8(panels, per_block, n, q8)


@torch.library.custom_op("ssd_chat::panel8_linear", mutates_args=())
def linear_op(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, max_rows: int,
              q8: bool = False) -> torch.Tensor:
    """`Panel8.matmul` for a compiled step, as panel.linear_op: x [rows, K] -> [rows, N], through the 8-bit panels
    for up to max_rows rows, else MKL's GEMM on the weight [N, K]."""
    if x.shape[0] > max_rows:
        return torch.nn.functional.linear(x, weight)
    return Panel8(q, d, weight.shape[0], q8).matmul(x)


@linear_op.register_fake
def _(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, max_rows: int,
      q8: bool = False) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])
