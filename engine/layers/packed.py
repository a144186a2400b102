"""Packed copies of the matmul weights, for the CPU's few-row steps (a k+1-row verify, the draft's glue pass): the
step's `linear`, and making and checking the copies at load (`pack_weights`). Which kernel runs which row counts,
and the measurements behind that choice: engine.layers.packed_kernels.

Layers with a bias stay unpacked (MKL adds it in another order). The cost is memory where the copies are float32
(mkl, onednn, panel: about the size of the weights), so the engine packs only when a draft is loaded, or where
one-row steps gain, and not for compiled steps unless the kernel is the panel one, which they call as an op
(``EngineConfig.fast_path``, ``panel.linear_op``). The 4- and 8-bit copies cost less than nothing: the float32
weights they replace are released at load (engine.layers.unread).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import panel, panel4, panel8, panel_cache
from engine.layers.packed_kernels import (
    EVERY_STEP,
    KERNELS,
    MAX_ROWS,
    available,
    family,
    max_rows,
    min_rows,
    resolve_kernel,
)

log = logging.getLogger(__name__)

PANELS = ("panel", "panel4", "q8")  # the kernels that run engine.layers.panel's kernels
LOW_BIT = (panel4.Panel4, panel8.Panel8)  # panel4's copies of weights that are 4- or 8-bit values
PROBE_ROWS = (64, 256)  # row counts past MAX_ROWS that same_products checks where every step takes it
CHECKED_PANELS = 96  # same_products checks the first 96 panels (3072 outputs) of a wider panel copy: see there
PACK_HINT = 8  # the row count the kernel is told to pack for; any row count may then use the packed weight


def linear(x: torch.Tensor, module: nn.Module, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, module.weight, bias)``, through ``module.packed`` (the weight's packed copy, or None) for
    ``module.packed_min_rows``..``module.packed_rows`` rows, or through ``module.low_bits`` (a draft's
    float16/int8 product).
    x: [..., K]; module.weight: [N, K]; returns [..., N]."""
    if torch.compiler.is_compiling():  # a compiled step keeps MKL's GEMM, or calls the panel kernel as an op
        if module.low_bits is not None:  # a draft's float16/int8 product, as an op (engine.layers.low_bits)
            return module.low_bits.op(x)
        if module.packed is None or module.packed_kernel not in PANELS:  # packed modules have no bias
            return F.linear(x, module.weight, bias)
        flat = x.reshape(x.numel() // x.shape[-1], x.shape[-1])
        y = module.packed.op(flat, module.weight, module.packed_rows) if isinstance(module.packed, LOW_BIT) \
            else panel.linear_op(flat, module.packed, module.weight, module.packed_rows)
        return y.view(*x.shape[:-1], y.shape[-1])
    if module.low_bits is not None:  # a CPU draft's float16/int8 weight (engine.layers.low_bits); never with a bias
        return module.low_bits(x)
    rows = x.numel() // x.shape[-1]
    if x.shape[-1] != module.weight.shape[1] or not _takes_packed(module, rows):
        return F.linear(x, module.weight, bias)
    if module.packed_kernel in PANELS:
        flat = x.reshape(rows, x.shape[-1])
        y = module.packed.matmul(flat) if isinstance(module.packed, LOW_BIT) \
            else panel.matmul(flat, module.packed, module.weight.shape[0])
        return y.view(*x.shape[:-1], y.shape[-1])
    if module.packed_kernel == "mkl":
        # the last argument is the row count the packed weight is used for (the packing hint is only a hint)
        return torch.ops.mkl._mkl_linear(x, module.packed, module.weight, bias, rows)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), module.packed, bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def runs_panels(module: nn.Module, rows: int) -> bool:
    """Whether an eager `linear` of `rows` rows runs the module's weight through the panel kernels (its packed copy
    is float32, 4-bit or 8-bit panels; packed modules have no bias)."""
    return module.low_bits is None and _takes_packed(module, rows) and module.packed_kernel in PANELS


def _takes_packed(module: nn.Module, rows: int) -> bool:
    """Whether a step of `rows` rows takes the module's packed copy (one exists, and the row count is in its range)."""
    return module.packed is not None and module.packed_min_rows <= rows <= module.packed_rows


def runs_q8(model: nn.Module) -> bool:
    """Whether some matmul of the model runs with 8-bit activations (a q8 copy: --cpu-matmul q8 took)."""
    return any(getattr(getattr(m, "packed", None), "q8", False) for m in bias_free_matmuls(model))


def panel_operands(packed: torch.Tensor | panel4.Panel4 | panel8.Panel8) -> tuple[str, tuple[torch.Tensor, ...]]:
    """A panel copy's kernel (the library's function) and the tensors it takes after x."""
    return (packed.kernel, packed.operands) if isinstance(packed, LOW_BIT) else ("panel_gemm", (packed,))


def pack(weight: torch.Tensor, kernel: str = "mkl") -> torch.Tensor | panel4.Panel4 | panel8.Panel8:
    """weight [N, K] (float32, CPU) -> its packed copy for `kernel` (an opaque mkldnn tensor; panel: a float32
    [ceil(N / 32), K, 32] tensor; panel4: a Panel4 where the weight is 4-bit values, a Panel8 where it is 8-bit
    values, else panel's)."""
    if kernel in ("panel4", "q8"):
        copy = panel_cache.low_bit(weight)
        if kernel == "q8" and copy is not None:
            return dataclasses.replace(copy, q8=True)
        return copy or panel.to_panels(weight)
    if kernel == "panel":
        return panel.to_panels(weight)
    if kernel == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_HINT)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_HINT)


def standin(weight: torch.Tensor, packed: torch.Tensor, kernel: str, rows: tuple[int, int] | None = None) -> nn.Module:
    """A bare module that `linear` runs through `packed` for `rows` (fewest, most; default: `kernel`'s own
    min_rows..max_rows) and through `weight` otherwise: for checks and benchmarks outside a model."""
    module = nn.Module()
    module.weight, module.packed, module.low_bits, module.packed_kernel = weight, packed, None, family(kernel)
    module.packed_min_rows, module.packed_rows = rows or (min_rows(kernel), max_rows(kernel))
    return module


def same_products(weight: torch.Tensor, packed: torch.Tensor, kernel: str = "mkl") -> bool:
    """Whether the packed weight gives the plain GEMM's products for every row count it is used for: exactly
    (mkl), or to float32 rounding (onednn and panel, other kernels; panel's rows also equal its one-row products
    bit for bit); q8's low-bit copies give the float32 products of the activations they round to 8 bits. Of a
    panel copy wider than CHECKED_PANELS panels, the first ones: the kernels run every 32-output panel by the same
    code (threads take runs of panels), and the whole 49152-output head took 0.9 s of every start, the 5 layer
    shapes 0.1."""
    weight, packed = _first_panels(weight, packed, CHECKED_PANELS)
    generator = torch.Generator().manual_seed(0)
    probe = standin(weight, packed, kernel)
    many = PROBE_ROWS if max_rows(kernel) > MAX_ROWS[kernel] else ()
    if family(kernel) == "panel":  # each of 1..8 rows has its own code; more rows go 8 at a time
        counts = (*range(1, 9), 13, MAX_ROWS[kernel], *many)
    else:
        counts = (*range(min_rows(kernel), MAX_ROWS[kernel] + 1), *many)
    q8 = isinstance(packed, LOW_BIT) and packed.q8
    float32 = panel.to_panels(weight) if isinstance(packed, LOW_BIT) and not q8 else None  # the bits it owes
    for rows in counts:
        x = torch.randn(rows, weight.shape[1], generator=generator)
        got, want = linear(x, probe), F.linear(x, weight)
        if q8:  # the products of the activations it rounds to 8 bits
            want = F.linear(panel4.q8_activations(x), weight)
        if not (torch.equal(got, want) if kernel == "mkl" else torch.allclose(got, want, rtol=1e-4, atol=1e-4)):
            return False
        if family(kernel) == "panel" and not torch.equal(got[-1:], linear(x[-1:], probe)):
            return False
        if float32 is not None and not torch.equal(got, panel.matmul(x, float32, weight.shape[0])):
            return False
    return True


def _first_panels(weight: torch.Tensor, packed, count: int) -> tuple[torch.Tensor, object]:
    """(weight [N, K], its panel copy) -> the first `count` panels' outputs of both, where N is more (an opaque
    mkl / onednn copy stays whole)."""
    n = count * panel.WIDTH
    if weight.shape[0] <= n:
        return weight, packed
    if isinstance(packed, panel4.Panel4):
        return weight[:n], dataclasses.replace(packed, q=packed.q[:count], d=packed.d[:count], m=packed.m[:count], n=n)
    if isinstance(packed, panel8.Panel8):
        return weight[:n], dataclasses.replace(packed, q=packed.q[:count], d=packed.d[:count], n=n)
    if isinstance(packed, torch.Tensor) and packed.layout == torch.strided and packed.dim() == 3:  # float32 panels
        return weight[:n], packed[:count]
    return weight, packed


def bias_free_matmuls(model: nn.Module) -> list[nn.Module]:
    """The model's matmul modules (linear layers and LM heads) with a weight on this rank and no bias: the ones
    a packed copy (here) or a fewer-bit one (engine.layers.low_bits) can stand in for."""
    from engine.layers.embedding import ParallelLMHead, ReducedLMHead
    from engine.layers.linear import ColumnParallelLinear, RowParallelLinear

    kinds = (ColumnParallelLinear, RowParallelLinear, ParallelLMHead, ReducedLMHead)
    return [m for m in model.modules() if isinstance(m, kinds) and m.weight.numel() > 0
            and getattr(m, "bias", None) is None]


def pack_weights(model: nn.Module, kernel: str = "auto") -> int:
    """Give every bias-free matmul module of a float32 CPU model a ``packed`` copy of its weight for `kernel`
    ("auto": `default_kernel()`; modules sharing a weight share the copy; a bias is added in another order than
    F.linear's, so those modules stay unpacked). Returns the number of weights packed: 0 when the kernel is
    missing, the model is not float32 on the CPU, or the packed products differ from the plain GEMM's for any
    weight shape (checked once per shape)."""
    modules = bias_free_matmuls(model)
    kernel = resolve_kernel(kernel)
    if kernel not in KERNELS:
        raise ValueError(f"packed kernel must be auto or one of {', '.join(KERNELS)}, got {kernel!r}")
    if not available(kernel) or not modules:
        return 0
    first = modules[0].weight
    if first.device.type != "cpu" or first.dtype != torch.float32:
        return 0
    copies: dict[int, torch.Tensor | panel4.Panel4 | panel8.Panel8] = {}
    checked: set[tuple[int, ...]] = set()
    packed_bytes = 0
    for module in modules:
        key = id(module.weight)
        if key not in copies:
            copies[key] = pack(module.weight, kernel)
            low_bit = isinstance(copies[key], LOW_BIT)
            packed_bytes += copies[key].nbytes if low_bit else module.weight.numel() * module.weight.element_size()
            shape = (*module.weight.shape, *module.weight.stride(), type(copies[key]).__name__)
            if shape not in checked and not same_products(module.weight, copies[key], kernel):
                (log.warning if kernel == "q8" else log.info)(
                    "the %s packed GEMM does not reproduce the plain one for a %s weight here: few-row steps stay "
                    "unpacked", kernel, tuple(module.weight.shape))
                for m in modules:
                    m.packed = None
                return 0
            checked.add(shape)
        module.packed, module.packed_kernel, module.packed_rows = copies[key], family(kernel), max_rows(kernel)
        module.packed_min_rows = min_rows(kernel)
    four, eight = (sum(isinstance(c, kind) for c in copies.values()) for kind in LOW_BIT)
    log.info("packed %d weights (%d of them 4-bit, %d 8-bit) for %s steps of %d-%s rows (copies of about %.0f MB)",
             len(copies), four, eight, kernel, min_rows(kernel),
             "any" if max_rows(kernel) == EVERY_STEP else max_rows(kernel), packed_bytes / 1e6)
    return len(copies)
