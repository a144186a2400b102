"""MKL-packed copies of the matmul weights, for the CPU's few-row steps (a k+1-row verify, the draft's glue pass).

For one row MKL runs a GEMV that streams the weights at the memory bound. For 2-8 rows its GEMM first packs
the weight into its own panel layout, on every call: that copy is most of why a 5-row verify of SmolLM2-135M
cost 1.5x a one-row step on one core. Packing each weight once at load time (``cblas_sgemm_pack``, through
``torch.ops.mkl``) and calling ``cblas_sgemm_compute`` on it removes the copy. Measured on the 2-core AVX-512
box, SmolLM2-135M's matmuls on one core (ms, plain K-major GEMM / packed):

    rows    1      2      3      4      5      6      7      8      10     16
            36/-   45/40  47/45  52/47  56/51  61/52  65/57  71/56  79/86  86/97

so only 2..MAX_ROWS rows take the packed path (one row keeps the GEMV; more rows are faster unpacked).

The products are the K-major GEMM's, bit for bit (the same MKL kernel, minus the copy): `pack_weights` checks
this once per weight shape and packs nothing where it does not hold (another MKL, weights not K-major), and
leaves layers with a bias unpacked (MKL adds it in another order), so this path never changes a token. The cost
is memory: the packed copies are about the size of the float32 weights, so the engine packs only when a draft
is loaded and the steps are not compiled (``EngineConfig.fast_path``).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

MAX_ROWS = 8   # rows beyond this run faster on the plain GEMM (table above)
PACK_HINT = 8  # the row count MKL is told to pack for; any row count may then use the packed weight


def available() -> bool:
    return torch.backends.mkl.is_available() and torch.backends.mkldnn.is_available() \
        and hasattr(torch.ops.mkl, "_mkl_linear")


def linear(x: torch.Tensor, module: nn.Module, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, module.weight, bias)``, through ``module.packed`` (the weight's MKL-packed copy, or None)
    for 2..MAX_ROWS rows. x: [..., K]; module.weight: [N, K]; returns [..., N]."""
    if torch.compiler.is_compiling():  # a compiled step keeps its own GEMM and never sees the packed copy
        return F.linear(x, module.weight, bias)
    rows = x.numel() // x.shape[-1]
    if module.packed is None or not 2 <= rows <= MAX_ROWS or x.shape[-1] != module.weight.shape[1]:
        return F.linear(x, module.weight, bias)
    # the last argument is the row count the packed weight is used for (the packing hint is only a hint)
    return torch.ops.mkl._mkl_linear(x, module.packed, module.weight, bias, rows)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (float32, CPU) -> its MKL-packed copy (an opaque mkldnn tensor)."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_HINT)


def same_products(weight: torch.Tensor, packed: torch.Tensor) -> bool:
    """Whether the packed weight gives exactly the plain GEMM's products for every row count it is used for."""
    generator = torch.Generator().manual_seed(0)
    for rows in range(2, MAX_ROWS + 1):
        x = torch.randn(rows, weight.shape[1], generator=generator)
        if not torch.equal(torch.ops.mkl._mkl_linear(x, packed, weight, None, rows), F.linear(x, weight)):
            return False
    return True


def pack_weights(model: nn.Module) -> int:
    """Give every bias-free matmul module of a float32 CPU model a ``packed`` copy of its weight (modules sharing
    a weight share the copy; a bias is added in another order than F.linear's, so those modules stay unpacked).
    Returns the number of weights packed: 0 when MKL is missing, the model is not float32 on the CPU, or the
    packed products differ from the plain GEMM's for any weight shape (checked once per shape)."""
    from engine.layers.embedding import ParallelLMHead, ReducedLMHead
    from engine.layers.linear import ColumnParallelLinear, RowParallelLinear

    kinds = (ColumnParallelLinear, RowParallelLinear, ParallelLMHead, ReducedLMHead)
    modules = [m for m in model.modules() if isinstance(m, kinds) and m.weight.numel() > 0
               and getattr(m, "bias", None) is None]
    if not available() or not modules:
        return 0
    first = modules[0].weight
    if first.device.type != "cpu" or first.dtype != torch.float32:
        return 0
    copies: dict[int, torch.Tensor] = {}
    checked: set[tuple[int, ...]] = set()
    packed_bytes = 0
    for module in modules:
        key, shape = id(module.weight), (*module.weight.shape, *module.weight.stride())
        if key not in copies:
            copies[key] = pack(module.weight)
            packed_bytes += module.weight.numel() * module.weight.element_size()
            if shape not in checked and not same_products(module.weight, copies[key]):
                log.info("MKL's packed GEMM does not reproduce the plain one for a %s weight here: few-row steps "
                         "stay unpacked", tuple(module.weight.shape))
                for m in modules:
                    m.packed = None
                return 0
            checked.add(shape)
        module.packed = copies[key]
    log.info("packed %d weights for few-row steps (about %.0f MB more)", len(copies), packed_bytes / 1e6)
    return len(copies)
