"""4-bit copies of weights that are 4-bit values already, for the panel kernel: the same bits, a fifth of the bytes.

SmolLM2-135M's layer weights are the Q4_1 values of the GGUF file it is converted from: per 32 inputs of an
output column a float16 scale d and minimum m, 4-bit q, dequantised as d * q + m in float32. Stored as float32,
every decode step reads 32 bits for those 4.5. `compress` recovers a (q, d, m) that rebuilds a weight exactly,
bit for bit, or says it cannot; the kernel (``panel4_gemm`` in engine/kernels/panel_gemm.cpp) rebuilds each
weight with one FMA (d * q is exact in float32: an 11-bit mantissa times a 4-bit integer) and runs the float32
panel kernel's FMA chain, so its outputs are the float32 panel kernel's bits (checked when packing, and tested).
Any weight that is not of that form (a draft's, a random model's) keeps its float32 panels.

Layout per 32-column panel p: Q [P, K, 16] bytes (column j's q in the low nibble, column j + 16's in the high
one), D and M [P, K / 32, 32] float32. 0.75 bytes per weight against 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers import panel

BLOCK = 32  # inputs per (d, m): Q4_1's block
LEVELS = 15  # q in 0..15
TRIES = (0, 1, -1, 2, -2)  # float16 steps around the first guess of d
MISFIT = 0.01  # blocks the first guess may miss before a weight is taken for float32 values


@dataclass(frozen=True)
class Panel4:
    """A weight [n, K] as 4-bit panels (see the module's doc)."""

    q: torch.Tensor  # [n / 32, K, 16] uint8
    d: torch.Tensor  # [n / 32, K / 32, 32] float32
    m: torch.Tensor  # [n / 32, K / 32, 32] float32
    n: int
    q8: bool = False  # products with 8-bit activations (engine/kernels/q8_gemm.cpp, --cpu-matmul q8): not these bits

    @property
    def nbytes(self) -> int:
        """The bytes a step reads: 0.75 a weight."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m))

    @property
    def kernel(self) -> str:
        """The library's function, which takes `operands` after x."""
        return "panel4q8_gemm" if self.q8 else "panel4_gemm"

    @property
    def operands(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.d, self.m

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, K] float32 @ the weight -> [rows, n], on torch's thread count."""
        assert self.q.shape[1] == x.shape[1], (x.shape, self.q.shape)
        return panel.gemm(self.kernel, x, self.n, *self.operands)

    def op(self, x: torch.Tensor, weight: torch.Tensor, max_rows: int) -> torch.Tensor:
        """`matmul` as one opaque op, for a compiled step (panel.linear_op's contract)."""
        return linear_op(x, self.q, self.d, self.m, weight, max_rows, self.q8)


def q8_activations(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] float32 -> the activations q8_gemm.cpp multiplies instead (a Panel4 or Panel8 with q8): per 32
    inputs dx * round(x * (127 / max |x|)), dx = max |x| / 127, with the kernel's float32 roundings (its products
    are these activations' float32 products, up to the order of the sum); a block whose 127 / max |x| is not
    finite counts as zeros, as there. NaN blocks are not modelled (the kernel makes their products NaN)."""
    blocks = x.reshape(-1, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.full_like(amax, 127.0).div(amax)  # a true division (127 / amax multiplies by a reciprocal)
    inv = torch.where((amax > 0) & (scale <= torch.finfo(torch.float32).max), scale, torch.zeros_like(amax))
    return ((blocks * inv).round().clamp(-127, 127) * (amax / 127)).reshape(x.shape)


def compress(weight: torch.Tensor) -> Panel4 | None:
    """weight [N, K] float32 -> its 4-bit panels when every block of 32 inputs of every column is d * q + m
    (d a float16 value, q in 0..15) to the bit, else None."""
    n, k = weight.shape
    if n % panel.WIDTH or k % BLOCK or weight.dtype != torch.float32:
        return None
    w = weight.detach().reshape(-1, BLOCK)  # [N * B, 32]
    m = w.amin(-1, keepdim=True)  # q = 0 is the block's minimum (Q4_1 sets m to it)
    fit = fit_blocks(w, ((w.amax(-1, keepdim=True) - m) / LEVELS).half(), m, 0, LEVELS)
    if fit is None:
        return None
    d, q = fit
    q, d, m = q.view(n, k // BLOCK, BLOCK).reshape(n, k), d.view(n, k // BLOCK, 1), m.view(n, k // BLOCK, 1)
    codes = q.to(torch.uint8).view(n // panel.WIDTH, panel.WIDTH, k).transpose(1, 2)  # [P, K, 32]
    packed_q = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).contiguous()
    per_block = [t.expand(n, k // BLOCK, 1).reshape(n // panel.WIDTH, panel.WIDTH, k // BLOCK).transpose(1, 2)
                 .contiguous() for t in (d, m)]  # [P, B, 32]
    return Panel4(packed_q, per_block[0], per_block[1], n)


def fit_blocks(w: torch.Tensor, guess: torch.Tensor, offset: torch.Tensor | float, lo: int, hi: int
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per block (row) of w [blocks, 32]: a float16 scale d near `guess` [blocks, 1] and integers q in lo..hi with
    d * q + offset == w to the bit (d * q is exact in float32), as float32 (d [blocks, 1], q [blocks, 32]); None
    when some block has none. Tries `guess`, then +-1 and +-2 float16 steps for the blocks still missing, and
    stops early when the first guess misses more than MISFIT of the blocks (plainly not such values)."""
    offset = torch.as_tensor(offset).expand(w.shape[0], 1)
    d, q = guess.float(), torch.zeros_like(w)
    todo = torch.arange(w.shape[0])
    for step in TRIES:  # the first guess fits nearly every block; the others retry only the rest
        cand = half_step(guess[todo], step).float()
        cq = ((w[todo] - offset[todo]) / torch.where(cand > 0, cand, 1.0)).round().clamp(lo, hi) * (cand > 0)
        exact = ((cand * cq + offset[todo]).view(torch.int32) == w[todo].view(torch.int32)).all(-1)
        d[todo[exact]], q[todo[exact]] = cand[exact], cq[exact]
        todo = todo[~exact]
        if todo.numel() == 0 or todo.numel() > MISFIT * w.shape[0]:  # done, or plainly not such values
            break
    return None if todo.numel() else (d, q)


def half_step(x: torch.Tensor, steps: int) -> torch.Tensor:
    """float16 x moved `steps` representable values up (non-negative x; 0 stays 0 below)."""
    if steps == 0:
        return x
    bits = x.view(torch.int16).to(torch.int32) + steps
    return bits.clamp(0, 0x7BFF).to(torch.int16).view(torch.float16)


@torch.library.custom_op("ssd_chat::panel4_linear", mutates_args=())
def linear_op(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, weight: torch.Tensor,
              max_rows: int, q8: bool = False) -> torch.Tensor:
    """`matmul` for a compiled step (one opaque op), as panel.linear_op: x [rows, K] -> [rows, N], through the
    4-bit panels for up to max_rows rows, else MKL's GEMM on the weight [N, K]."""
    if x.shape[0] > max_rows:
        return torch.nn.functional.linear(x, weight)
    return Panel4(q, d, m, weight.shape[0], q8).matmul(x)


@linear_op.register_fake
def _(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, weight: torch.Tensor,
      max_rows: int, q8: bool = False) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])
