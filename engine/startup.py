"""Starting an LLM's ranks: the TP ranks 1.. in their processes, the target (rank 0) and the draft in this one,
and SSD's draft process; then the EngineCore that drives them.

engine.llm calls `start_engine` once, from its constructor; on failure it stops whatever was started (the TP
processes are appended to the caller's list as they start, so that its close() finds them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import tp_worker
from engine.attention import make_backend
from engine.build import WORKER_TIMEOUT, build_drafter, fast_kwargs
from engine.config import EngineConfig, FastPath
from engine.core import EngineCore
from engine.detokenizer import check_same_tokenizer
from engine.distributed import RankSpec, free_port, make_collective_group, make_group, spawn_rank
from engine.draft_server import DraftSpec
from engine.errors import EngineError, InvalidParameterError
from engine.kv.block_manager import BlockManager
from engine.layers.parallel import TensorParallel
from engine.loader import build_model
from engine.model_dir import ModelFiles, inspect_model_dir
from engine.models.args import ModelArgs
from engine.placement import Placement
from engine.registry import resolve_model
from engine.remote_drafter import DraftLost, RemoteDrafter
from engine.runner import ModelRunner
from engine.tp_worker import BroadcastingRunner, TargetShardSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    core: EngineCore
    model_args: ModelArgs
    eos_token_ids: frozenset[int]
    remote: RemoteDrafter | None  # SSD's draft process, with a --draft-device


@dataclass(frozen=True)
class Sizes:
    num_blocks: int
    max_model_len: int
    dtype: torch.dtype


def check_draft(config: EngineConfig, model_path: Path, tokenizer: Callable[[], Any]) -> Path:
    """The draft's model directory, checked: a model (one line naming the fix, where not), with the target's
    tokenizer (the same files, or the same vocabulary and special tokens; `tokenizer()` loads the target's)."""
    draft_path = resolve_model(config.draft)
    inspect_model_dir(draft_path)
    if not same_tokenizer_files(model_path, draft_path):
        check_same_tokenizer(tokenizer(), load_tokenizer(draft_path), target=config.target, draft=config.draft)
    return draft_path


def context_sizes(config: EngineConfig, model_config: dict) -> tuple[int, int, int]:
    """(max_model_len, the model's own limit, KV blocks) for `config` (InvalidParameterError where they clash)."""
    model_max = int(model_config.get("max_position_embeddings", 4096))
    if config.max_model_len is not None and config.max_model_len > model_max:
        raise InvalidParameterError(
            f"max_model_len {config.max_model_len} exceeds the model's limit of {model_max} tokens"
        )
    max_model_len = config.max_model_len or model_max
    kv_tokens = config.kv_cache_tokens or 2 * max_model_len
    if kv_tokens < max_model_len:
        raise InvalidParameterError(f"kv_cache_tokens ({kv_tokens}) must be at least max_model_len ({max_model_len})")
    return max_model_len, model_max, -(-kv_tokens // config.block_size)


def draft_process_starts(config: EngineConfig, placement: Placement) -> bool:
    """Whether `start_engine` starts SSD's draft process: a draft model, and a device of its own for it."""
    return config.draft is not None and placement.draft is not None


def start_engine(config: EngineConfig, placement: Placement, files: ModelFiles, model_path: Path,
                 draft_path: Path | None, tokenizer: Callable[[], Any], sizes: Sizes, workers: list) -> Started:
    """Load the target (rank 0 here, TP ranks 1.. in their processes, appended to `workers`), the draft, and
    the draft process: started first, it loads its draft while this process loads the target and its tokenizer
    (`tokenizer()`: 1.1 s of this process's start, on the CPU, that the draft process's start no longer waits for)."""
    fast = config.fast_path  # (the kernel choice behind it may build the CPU kernels: once)

    def spec(on: torch.device) -> DraftSpec:
        return DraftSpec(str(draft_path), sizes.num_blocks, config.block_size, sizes.max_model_len,
                         config.max_num_seqs, config.enable_prefix_caching, config.dtype, str(on), fast,
                         str(model_path), prefill_chunk=config.prefill_chunk)

    remote = None
    if draft_process_starts(config, placement):
        log.info("starting the draft process on %s", placement.draft)
        remote = RemoteDrafter(spec(torch.device(placement.draft.torch_device)),
                               RankSpec(1, placement.draft.cores, placement.threads_for(placement.draft) or 1),
                               timeout_s=config.draft_timeout_s)
    try:
        return _start(config, fast, placement, files, model_path, tokenizer(), sizes, workers, spec, remote)
    except BaseException:
        if remote is not None:
            remote.close()
        raise


def _start(config: EngineConfig, fast: FastPath, placement: Placement, files: ModelFiles, model_path: Path, tokenizer,
           sizes: Sizes, workers: list, spec, remote: RemoteDrafter | None) -> Started:
    device = torch.device(placement.target[0].torch_device)
    tp = TensorParallel()
    if placement.tp > 1:
        port = free_port()
        nccl_port = free_port() if device.type == "cuda" else None  # TP all-reduce on NCCL (CUDA)
        for rank, rank_device in enumerate(placement.target[1:], start=1):
            shard = TargetShardSpec(str(model_path), rank, placement.tp, sizes.num_blocks, config.block_size,
                                    sizes.max_model_len, config.dtype, rank_device.torch_device, fast,
                                    nccl_port)
            rank_spec = RankSpec(rank, rank_device.cores, placement.threads_for(rank_device) or 1)
            workers.append(spawn_rank(tp_worker.serve, rank_spec, port, placement.tp, shard))
        control = make_group(port, 0, placement.tp, WORKER_TIMEOUT, workers)
        collective = control if nccl_port is None else \
            make_collective_group(nccl_port, 0, placement.tp, device, WORKER_TIMEOUT)
        tp = TensorParallel(0, placement.tp, collective)
    log.info("loading %s (%s) on %s", config.target, model_path, device)
    model = build_model(files.config, files.weight_files, max_positions=sizes.max_model_len, dtype=sizes.dtype,
                        device=device, tp=tp, k_major=fast.k_major, packed=fast.packed,
                        packed_kernel=fast.packed_kernel, release=not fast.compile)
    kwargs = dict(num_blocks=sizes.num_blocks, block_size=config.block_size, device=device, dtype=sizes.dtype,
                  **fast_kwargs(fast, device, tp=placement.tp, max_keys=sizes.max_model_len,
                                rows=config.draft is not None))
    backend = make_backend(fast.attention, device, sizes.dtype)
    if placement.tp > 1:
        runner = BroadcastingRunner(model, backend, group=control, **kwargs)
    else:
        runner = ModelRunner(model, backend, **kwargs)
    eos_token_ids = eos_ids(model_path, model.args.eos_token_ids, tokenizer)
    drafter = None
    if config.draft is not None:
        drafter = build_drafter(spec(device))
        if drafter.runner.model.args.vocab_size != model.args.vocab_size:
            raise EngineError(
                f"draft {config.draft} has a vocabulary of {drafter.runner.model.args.vocab_size}, the target"
                f" {model.args.vocab_size}: pick a draft of the same model family"
            )
    if remote is not None:
        try:
            remote.connect(model.args.vocab_size)
        except DraftLost as exc:
            raise EngineError(f"{exc}: check --draft-device, or run without it (draft in-process)") from exc
    blocks = BlockManager(sizes.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching)
    core = EngineCore(runner, blocks, max_model_len=sizes.max_model_len, max_num_seqs=config.max_num_seqs,
                      eos_token_ids=eos_token_ids, drafter=drafter, ssd_drafter=remote,
                      prefill_chunk=config.prefill_chunk)
    return Started(core, model.args, eos_token_ids, remote)


BACKEND = "TokenizersBackend"  # transformers' class for a tokenizer.json (what its saves and our conversions name)


def load_tokenizer(path: Path):
    """The model directory's tokenizer, as AutoTokenizer loads it. Files that name transformers' TokenizersBackend
    (and no code of their own) load that class directly: AutoTokenizer picks the same class for them (a test
    checks, model by model) after importing its whole class map and the model's config, 1.7 s of every start."""
    if _names_backend(path):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _names_backend(path: Path) -> bool:
    config = _tokenizer_config(path)
    return (config is not None and config.get("tokenizer_class") == BACKEND and "auto_map" not in config
            and (path / "tokenizer.json").is_file())


def _tokenizer_config(path: Path) -> dict | None:
    """tokenizer_config.json's settings: {} where there is none, None where it cannot be read as a JSON object."""
    file = path / "tokenizer_config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


IGNORED_CONFIG_KEYS = ("local_files_only", "name_or_path", "_name_or_path")  # how it was loaded, not the vocabulary


def same_tokenizer_files(a: Path, b: Path) -> bool:
    """Whether two model directories tokenize alike by their files alone: the same tokenizer.json bytes and the
    same tokenizer_config.json (added tokens, special tokens) but for how each was loaded. False says nothing:
    compare the loaded vocabularies then. Loading the draft's tokenizer only to compare it took 0.3 s a start."""
    if not ((a / "tokenizer.json").is_file() and (b / "tokenizer.json").is_file()):
        return False
    if (a / "tokenizer.json").read_bytes() != (b / "tokenizer.json").read_bytes():
        return False
    configs = [_tokenizer_config(a), _tokenizer_config(b)]
    if None in configs:
        return False
    first, second = ({k: v for k, v in c.items() if k not in IGNORED_CONFIG_KEYS} for c in configs)
    return first == second


def eos_ids(path: Path, from_config: tuple[int, ...], tokenizer) -> frozenset[int]:
    """The ids that end a reply: the model config's, generation_config.json's and the tokenizer's."""
    ids = set(from_config)
    gen_cfg = path / "generation_config.json"
    if gen_cfg.is_file():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
