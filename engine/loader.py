"""Build a model from a Hugging Face directory and load its safetensors, sliced for this TP rank.

An ssd-chat draft may borrow its input embedding from its target (config ``"embedding_from_target": true``):
its files then lack ``model.embed_tokens.weight``, which is read from the target's files instead. Its matmul
weights may be stored in int8 (``engine.layers.low_bits.int8_rows``: an int8 tensor ``NAME`` and its float32 row
scales ``NAME_scale``); they are loaded as ``q * scale``, which the draft's int8 product quantizes back to the
same q.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine import interrupts
from engine.errors import ModelFilesError, WeightShapeError, check_shape
from engine.layers import greedy_head
from engine.layers.linear import to_k_major
from engine.layers.low_bits import quantize_weights
from engine.layers.packed import pack_weights
from engine.layers.parallel import SINGLE, TensorParallel
from engine.layers.unread import release_unread
from engine.models.args import ModelArgs
from engine.models.llama import PACKED, CausalLM

log = logging.getLogger(__name__)

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
EMBEDDING = "model.embed_tokens.weight"
VOCAB_IDS = "lm_head.vocab_ids"  # a compact reduced head's token ids (engine.layers.embedding.ReducedLMHead)
SCALE_SUFFIX = "_scale"  # an int8 weight's row scales: NAME -> NAME_scale


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """An int8 weight q [N, K] with its row scales [N] -> float32 [N, K]."""
    return q.float() * scales.float()[:, None]


def get_tensor(f, name: str) -> torch.Tensor:
    """f.get_tensor(name) with a Ctrl-C held until it returns (engine.interrupts: safetensors turned one into an
    unrelated error)."""
    with interrupts.held():
        return f.get_tensor(name)


def read_tensor(f, name: str) -> torch.Tensor:
    """Tensor `name` of an open safetensors file, int8 weights dequantized with their row scales."""
    tensor = get_tensor(f, name)
    if tensor.dtype == torch.int8:
        if name + SCALE_SUFFIX not in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            raise ModelFilesError(f"int8 tensor {name} has no {name + SCALE_SUFFIX}: the weights are not ssd-chat's "
                                  "int8 format")
        scales = get_tensor(f, name + SCALE_SUFFIX)
        if tensor.dim() != 2 or tuple(scales.shape) != (tensor.shape[0],):
            raise ModelFilesError(f"int8 tensor {name} {tuple(tensor.shape)} has scales {name + SCALE_SUFFIX} of "
                                  f"shape {tuple(scales.shape)}, not one per row: the weights are corrupt")
        tensor = dequantize(tensor, scales)
    return tensor


def _target_name(name: str) -> tuple[str, object]:
    for fragment, (fused, shard_id) in PACKED.items():
        if f".{fragment}." in name:
            return name.replace(f".{fragment}.", f".{fused}."), shard_id
    return name, None


def _copy_whole(param: torch.nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
    check_shape(full.shape, param.shape)
    param.data.copy_(full)


def _shape_error(path: Path, name: str, err: WeightShapeError, *, borrowed: bool) -> ModelFilesError:
    """`err` with the tensor and its file named, and what to do."""
    where = f"{path}: tensor {name} has shape {err.found}, where "
    if borrowed:  # a draft's embedding, from its target's files
        return ModelFilesError(f"{where}the draft's config.json gives {err.expected}: the draft borrows its "
                               "target's input embedding, so its target must have the same vocabulary and hidden size")
    return ModelFilesError(f"{where}config.json gives {err.expected}: the config and the weights are of different "
                           "models (restore the model's own config.json)")


def load_weights(model: CausalLM, weight_files: Iterable[Path], embedding_files: Iterable[Path] = ()) -> None:
    """Copy every checkpoint tensor into its (possibly fused, possibly sharded) parameter; from
    ``embedding_files`` (the target's, for a draft that borrows its embedding) only the embedding."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    weight_files = list(weight_files)
    sources = [(path, None) for path in weight_files] + [(path, EMBEDDING) for path in embedding_files]
    for path, only in sources:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name.endswith((*_IGNORED_SUFFIXES, SCALE_SUFFIX)) or (only is not None and name != only):
                        continue
                    if name == VOCAB_IDS and hasattr(model.lm_head, "set_vocab_ids"):
                        model.lm_head.set_vocab_ids(get_tensor(f, name))
                        continue
                    target, shard_id = _target_name(name)
                    param = params.get(target)
                    if param is None:
                        if name == "lm_head.weight" and model.args.tie_word_embeddings:
                            continue
                        log.debug("ignoring checkpoint tensor %s", name)
                        continue
                    tensor = read_tensor(f, name).to(param.dtype)
                    try:
                        getattr(param, "weight_loader", _copy_whole)(param, tensor, shard_id)
                    except WeightShapeError as exc:
                        raise _shape_error(path, name, exc, borrowed=only is not None) from exc
                    loaded.add(f"{target}:{shard_id}")
        except SafetensorError as exc:
            raise ModelFilesError(f"cannot read {path}: {exc}; delete it and download the model again") from exc
    finish = getattr(model.lm_head, "finish_loading", None)
    if finish is not None:
        finish()
    missing = _missing(model, loaded)
    if model.args.embedding_from_target and EMBEDDING in missing:
        raise ModelFilesError("this draft borrows its target's input embedding: load it as a draft (--draft) "
                              "with a target of the same tokenizer and hidden size")
    if missing:
        raise ModelFilesError(
            f"the weights in {Path(next(iter(weight_files))).parent} lack {len(missing)} tensors"
            f" (e.g. {missing[0]}): the download is incomplete or the model is not a plain Llama/Qwen3"
        )


def _missing(model: CausalLM, loaded: set[str]) -> list[str]:
    expected = []
    for name, _ in model.named_parameters():
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            expected += [f"{name}:{s}" for s in ("q", "k", "v")]
        elif "gate_up_proj" in name:
            expected += [f"{name}:{s}" for s in (0, 1)]
        else:
            expected.append(f"{name}:None")
    if model.args.tie_word_embeddings:
        expected = [e for e in expected if not e.startswith("lm_head.")]
    return [e.split(":")[0] for e in expected if e not in loaded]


def build_model(
    config: dict, weight_files: Iterable[Path], *, max_positions: int, dtype: torch.dtype,
    device: torch.device, tp: TensorParallel = SINGLE, embedding_files: Iterable[Path] = (), k_major: bool = True,
    packed: bool = False, packed_kernel: str = "auto", low_bits: str = "float32", release: bool = False,
) -> CausalLM:
    """The model, loaded; on the CPU with its fast copies (K-major, packed, fewer-bit); `release`: then without
    the float32 weights no eager step reads (engine.layers.unread; not for compiled steps)."""
    args = ModelArgs.from_hf_config(config)
    with torch.device(device):
        model = CausalLM(args, max_positions=max_positions, tp=tp)
    model.to(dtype=dtype)
    model.rotary.to(torch.float32)  # keep cos/sin tables in fp32; they are cast per forward if needed
    load_weights(model, list(weight_files), embedding_files)
    if k_major and torch.device(device).type == "cpu":
        to_k_major(model)
    # a fewer-bit product (a draft's) stands in for the packed copy, which would then go unused
    fewer_bits = dtype == torch.float32 and quantize_weights(model, low_bits) > 0
    if packed and not fewer_bits and torch.device(device).type == "cpu":
        pack_weights(model, packed_kernel)
        greedy_head.prepare(model.lm_head)
    if release and torch.device(device).type == "cpu":
        release_unread(model, exact_copies=not fewer_bits)
    return model.eval()
