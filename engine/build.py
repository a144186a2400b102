"""Building what each rank runs: the target (or its TP shard) and the draft, each with its runner and KV.

Used by the leader (engine.llm) and by the child processes (engine.tp_worker, engine.draft_server), so the
same settings build the same thing everywhere.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import torch

from engine.attention import make_backend
from engine.config import EngineConfig, FastPath
from engine.cuda_graphs import DEFAULT_MAX_BATCH, use_cuda_graphs
from engine.distributed import make_collective_group
from engine.draft_server import DraftSpec
from engine.errors import InvalidParameterError
from engine.kv.block_manager import BlockManager
from engine.layers.parallel import TensorParallel
from engine.loader import build_model
from engine.model_dir import inspect_model_dir
from engine.models.args import ModelArgs
from engine.runner import ModelRunner
from engine.ssd import SCRATCH_SLOTS, SsdDrafter
from engine.tp_worker import TargetShardSpec

log = logging.getLogger(__name__)

WORKER_TIMEOUT = datetime.timedelta(minutes=10)  # a TP rank that does not answer within this is lost


def build_drafter(spec: DraftSpec) -> SsdDrafter:
    """The draft model, its runner (with SSD scratch slots) and block manager: in the leader, or in the
    draft process."""
    files = inspect_model_dir(Path(spec.model_path))
    device = torch.device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    log.info("loading draft %s on %s", spec.model_path, device)
    borrowed = ()
    if files.config.get("embedding_from_target") and spec.target_path is not None:
        borrowed = inspect_model_dir(Path(spec.target_path)).weight_files
    model = build_model(files.config, files.weight_files, max_positions=spec.max_model_len, dtype=dtype,
                        device=device, embedding_files=borrowed, k_major=spec.fast.k_major,
                        packed=spec.fast.packed, packed_kernel=spec.fast.packed_kernel,
                        low_bits=spec.fast.draft_weights, release=not spec.fast.compile)
    runner = ModelRunner(model, make_backend(spec.fast.attention, device, dtype), num_blocks=spec.num_blocks,
                         block_size=spec.block_size, device=device, dtype=dtype,
                         extra_slots=spec.max_num_seqs * SCRATCH_SLOTS,
                         **fast_kwargs(spec.fast, device, tp=1, max_keys=spec.max_model_len, rows=True))
    blocks = BlockManager(spec.num_blocks, spec.block_size, enable_prefix_caching=spec.enable_prefix_caching)
    return SsdDrafter(runner, blocks, max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs)


def build_target_shard(spec: TargetShardSpec, group) -> ModelRunner:
    """A target TP rank's shard of the model and its KV cache."""
    files = inspect_model_dir(Path(spec.model_path))
    device = torch.device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    collective = group if spec.nccl_port is None else \
        make_collective_group(spec.nccl_port, spec.rank, spec.tp, device, WORKER_TIMEOUT)
    model = build_model(files.config, files.weight_files, max_positions=spec.max_model_len, dtype=dtype,
                        device=device, tp=TensorParallel(spec.rank, spec.tp, collective), k_major=spec.fast.k_major,
                        packed=spec.fast.packed, packed_kernel=spec.fast.packed_kernel, release=not spec.fast.compile)
    return ModelRunner(model, make_backend(spec.fast.attention, device, dtype), num_blocks=spec.num_blocks,
                       block_size=spec.block_size, device=device, dtype=dtype,
                       **fast_kwargs(spec.fast, device, tp=spec.tp, max_keys=spec.max_model_len))


def fast_kwargs(fast: FastPath, device: torch.device, *, tp: int, max_keys: int, rows: bool = False) -> dict:
    """A runner's fast paths. CUDA: decode graphs unless --eager, torch.compile with --compile. SDPA's graphs
    gather each row's keys (in key lengths up to max_keys), so they stay few; flashinfer's read pages in place.
    CPU: --compile compiles the one-sequence decode step (engine.compiled_decode), and with `rows` (a draft, or a
    target with a draft: verification) its several-row step too; not with TP (the all-reduce is not traced); --kv-dtype
    float16 keeps the KV cache in half."""
    if torch.device(device).type != "cuda":
        compiled = fast.compile and tp == 1
        half = {"kv_dtype": torch.float16} if fast.kv_dtype == "float16" else {}  # (the runner's default: the model's)
        return dict(compile_decode=compiled, compile_rows=compiled and rows, **half)
    graphs = use_cuda_graphs(device, eager=fast.eager, tp=tp)
    max_batch = DEFAULT_MAX_BATCH if fast.attention != "sdpa" else 8
    return dict(graph_batch=max_batch if graphs else 0, graph_max_keys=max_keys, compile_model=fast.compile)


def check_tp(config: dict, tp: int, name: str) -> None:
    if tp == 1:
        return
    args = ModelArgs.from_hf_config(config)
    for what, n in (("attention heads", args.num_heads), ("KV heads", args.num_kv_heads),
                    ("MLP width", args.intermediate_size), ("vocabulary", args.vocab_size)):
        if n % tp:
            raise InvalidParameterError(f"--tp {tp} does not divide {name}'s {n} {what}: pick a divisor of {n}")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of model weights one decode step reads (shared tensors counted once; a weight with 4- or 8-bit
    panels, engine.layers.panel4 / panel8, at those panels' bytes; of an input embedding not tied to the head,
    one row a token)."""
    from engine.layers import packed
    from engine.layers.embedding import VocabParallelEmbedding

    held = {id(p): p.numel() * p.element_size() for p in model.parameters()}  # a tied tensor counted once
    matmuls = {id(m.weight) for m in packed.bias_free_matmuls(model)}
    for m in model.modules():
        if type(m) is VocabParallelEmbedding and id(m.weight) not in matmuls:  # (the head class is a subclass)
            held[id(m.weight)] = m.weight.shape[-1] * m.weight.element_size()
    low_bit = {id(m.weight): m for m in packed.bias_free_matmuls(model)
               if isinstance(getattr(m, "packed", None), packed.LOW_BIT)}
    # a low-bit copy's panels in place of its float32 weight (held, or released at load: engine.layers.unread)
    return sum(held.values()) + sum(m.packed.nbytes - held.get(key, 0) for key, m in low_bit.items())


def warn_slow_compile(config: EngineConfig, device: torch.device) -> None:
    """A warning where --compile would take a CPU off faster steps than its own (MKL's GEMM for oneDNN's)."""
    from engine.layers.packed_kernels import one_row_pays, resolve_kernel

    if config.compile and device.type == "cpu" and one_row_pays(config.packed_kernel) \
            and resolve_kernel(config.packed_kernel) == "onednn":
        log.warning("--compile runs MKL's GEMM, which is slower on this CPU than the oneDNN-packed steps it replaces "
                    "(README: On AMD EPYC): leave --compile off here")
