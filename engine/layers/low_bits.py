"""The draft's matmul weights in fewer bits on the CPU (fbgemm's packed float16 or int8 GEMMs).

A draft only proposes tokens; the target verifies every one, so the draft's precision never changes a token
of the output, only how often its guesses are accepted. On the CPU a one-row step streams every weight from
memory, and the draft's steps run between the target's, which evict it from the cache: fewer bytes per weight
is most of the draft's cost. Measured on a 2-core AMD EPYC (Zen 3, AVX2), one core, the shipped draft's matmuls (4
SmolLM2 layers and an 8192-row head) with the cache flushed between steps (ms, float32 / float16 / int8):

    rows 1:  9.9 / 5.3 / 2.9        rows 5:  24.1 / 6.5 / 3.4

"float16": weights stored as float16, products accumulated in float32 (relative error about 2e-4).
"int8": weights quantized per output row (symmetric), activations per call (about 2e-2); fbgemm's dynamic
int8 GEMM. The target never takes this path: its products must stay those of its own dtype. On a CPU with
AVX-512 VNNI the same int8 weights run on the panel kernels instead (`int8_panels`: engine.layers.panel8's layout,
each row's scale in every block, products with the activations rounded to 8 bits per 32 inputs:
engine/kernels/q8_gemm.cpp), so the draft's one-sequence steps take the fused layers (engine.layers.fused) as the
target's do, without a dozen Python-level calls a layer. On CPUs with AVX2 and no AVX-512 (q8_avx2.cpp's code)
they take the panels too, except where 256-bit operations split in halves (`cpu_info.halves_256_bit`: AMD's Zen 1),
which keep fbgemm, as do AVX-512 CPUs without VNNI and VBMI (not measured):
- on a 2-vCPU AMD EPYC Zen 3 (2026-12-07) the draft's matmuls alone ran faster on fbgemm (1.27 against 1.75 ms a
  one-row step, warm), but its steps, fused, cost the target less: at a fixed k = 4 without the lookup it waited
  9.6 and 9.4 ms a round for drafts against fbgemm's 16.3 and 15.3 (`ssd-chat bench --modes sd`), and plain
  `ssd-chat`'s mode (sd-all) decoded at 118.7 and 134.8 tok/s against 106.2 and 120.9 (`--modes ar,sd,ssd,sd-all`,
  8 prompts, two runs each, interleaved);
- on a 2-vCPU AMD EPYC Zen 1 (2026-12-06; `--modes sd,ssd`, 8 prompts, two runs each, interleaved) q8's AVX2 code
  made the target wait longer for drafts a round, SD 2.1 and 2.3 ms against fbgemm's 1.8 and 1.9, SSD 3.9 and 4.2
  against 3.0 and 3.4 (on Zen 4 it was faster at one row, slower at five).
``SSD_CHAT_DRAFT_PANELS=always`` takes the panels wherever q8 runs, ``0`` keeps fbgemm everywhere.

A compiled step (--compile) cannot trace fbgemm's packed weight (a TorchScript object), so it calls the same
product as one opaque op, `ssd_chat::low_bits_linear`, that finds the weight by an integer key.
"""

from __future__ import annotations

import itertools
import logging
import os
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn

from engine import cpu_info
from engine.config import DRAFT_WEIGHTS
from engine.layers import native, panel, panel8
from engine.layers.packed import bias_free_matmuls
from engine.layers.packed_kernels import EVERY_STEP

log = logging.getLogger(__name__)

KINDS = DRAFT_WEIGHTS
PANELS_ENV = "SSD_CHAT_DRAFT_PANELS"  # int8 drafts on the panel kernels: "1" (see panels_wanted), "always", "0"

LowBitsLinear = Callable[[torch.Tensor], torch.Tensor]  # x [..., K] -> [..., N]

_LIVE: weakref.WeakValueDictionary[int, LowBits] = weakref.WeakValueDictionary()  # by key, while a module holds it
_KEYS = itertools.count()


class LowBits:
    """One weight's fewer-bit product: called eagerly, or through `op` inside a compiled step."""

    def __init__(self, product: LowBitsLinear, n: int):
        self.product, self.n, self.key = product, n, next(_KEYS)
        _LIVE[self.key] = self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        return self.product(x)

    def op(self, x: torch.Tensor) -> torch.Tensor:  # the same, as one op a compiled graph can hold
        return linear_op(x, self.key, self.n)


@torch.library.custom_op("ssd_chat::low_bits_linear", mutates_args=())
def linear_op(x: torch.Tensor, key: int, n: int) -> torch.Tensor:
    """The product of the live `LowBits` with this key: x [..., K] -> [..., n]."""
    return _LIVE[key].product(x)


@linear_op.register_fake
def _(x: torch.Tensor, key: int, n: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], n)


def available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def _float16(weight: torch.Tensor) -> LowBitsLinear:
    packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().float().contiguous(), None)
    return lambda x: torch.ops.quantized.linear_dynamic_fp16(x, packed)


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-output-row symmetric int8 form of weight [N, K]: q [N, K] int8 and scales [N] float32, with
    weight ~ q * scales[:, None]. Quantizing q * scales again gives the same q (its rows reach +-127), so a
    draft stored this way (ssd_chat.distill_model) runs the very int8 weights it was saved with."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)  # [N]
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)  # [N, K]
    return q, scales


def _int8(weight: torch.Tensor) -> LowBitsLinear:
    _, scales = int8_rows(weight)
    with warnings.catch_warnings():  # torch deprecates quantized tensors; fbgemm's prepack still takes only them
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(weight.detach().float().contiguous(), scales.double(),
                                       torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(q, None)
    return lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)


def int8_panels(weight: torch.Tensor) -> panel8.Panel8 | None:
    """The int8 form of weight [N, K] (`int8_rows`) as 8-bit panels run with 8-bit activations, or None where its
    shape has no whole panels and blocks."""
    n, k = weight.shape
    if n % panel.WIDTH or k % panel8.BLOCK:
        return None
    q, scales = int8_rows(weight)
    return panel8.from_rows(q, scales[:, None].expand(n, k // panel8.BLOCK), q8=True)


def panels_wanted() -> bool:
    """Whether an int8 draft takes the 8-bit panels ($SSD_CHAT_DRAFT_PANELS, read at each load): "1" (the default)
    where q8 runs its AVX-512 VNNI code, or its AVX2 code on a CPU without AVX-512 (measured on a Zen 3) that does not
    split 256-bit operations (cpu_info.halves_256_bit: measured slower on a Zen 1); AVX-512 CPUs without VNNI and
    VBMI (Skylake, Cascade Lake: not measured) keep fbgemm. "always" wherever q8 runs, "0" never (fbgemm)."""
    choice = os.environ.get(PANELS_ENV, "1")
    if choice == "0" or not native.q8_available():
        return False
    if choice == "always" or native.q8_vnni():
        return True
    return "avx512" not in native.cpu_isas() and not cpu_info.halves_256_bit()


def _on_panels(modules: list[nn.Module]) -> int:
    """Run every module's int8 weight on the 8-bit panels (all of them, or none: the fused layers take a step
    only when every product of a layer runs the panel kernels): the number of weights, 0 where not."""
    if not panels_wanted():
        return 0
    copies: dict[int, panel8.Panel8 | None] = {}
    for module in modules:
        if id(module.weight) not in copies:
            copies[id(module.weight)] = int8_panels(module.weight)
    if any(c is None for c in copies.values()):
        return 0
    for module in modules:
        module.packed, module.packed_kernel = copies[id(module.weight)], "panel"
        module.packed_min_rows, module.packed_rows = 1, EVERY_STEP
    log.info("draft matmuls in int8 on the panel kernels: %d weights", len(copies))
    return len(copies)


def quantize_weights(model: nn.Module, kind: str) -> int:
    """Give every bias-free matmul module of a CPU draft a ``low_bits`` callable that computes its product from
    a `kind` copy of its weight (modules sharing a weight share it), or for int8 where the panel kernels run
    with 8-bit activations, a ``packed`` 8-bit panel copy (`int8_panels`). The float32 weights are released at load
    unless a compiled step reads them (engine.layers.unread). Returns the number of weights converted: 0 for "float32",
    without fbgemm (and not on the panels), or off the CPU."""
    if kind not in KINDS:
        raise ValueError(f"draft weights must be one of {', '.join(KINDS)}, got {kind!r}")
    modules = bias_free_matmuls(model)
    if kind == "float32" or not modules or modules[0].weight.device.type != "cpu":
        return 0
    if kind == "int8" and (on_panels := _on_panels(modules)):
        return on_panels
    if not available():
        log.info("this torch has no fbgemm: the draft keeps its float32 weights")
        return 0
    make = _float16 if kind == "float16" else _int8
    copies: dict[int, LowBits] = {}
    for module in modules:
        if id(module.weight) not in copies:
            copies[id(module.weight)] = LowBits(make(module.weight), module.weight.shape[0])
        module.low_bits = copies[id(module.weight)]
    log.info("draft matmuls in %s: %d weights", kind, len(copies))
    return len(copies)
