"""The public entry point: ``LLM`` loads a model and generates, streams or chats.

One LLM is driven by one thread at a time (the TUI runs it in a worker thread). Streams may be
interleaved: each request's events are buffered until its own consumer reads them.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from engine.attention import make_backend
from engine.config import DEFAULT_TARGET, EngineConfig, SpeculationConfig
from engine.core import EngineCore
from engine.detokenizer import IncrementalDetokenizer, check_same_tokenizer, make_decoder
from engine.errors import EngineError, InvalidParameterError, PromptTooLongError
from engine.kv.block_manager import BlockManager
from engine.loader import build_model
from engine.model_dir import inspect_model_dir
from engine.outputs import Event, FinishReason, RequestOutput
from engine.registry import resolve_model
from engine.request import RequestState
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.ssd import SCRATCH_SLOTS, SsdDrafter

log = logging.getLogger(__name__)

Prompt = str | list[int]


class LLM:
    def __init__(
        self, target: str = DEFAULT_TARGET, *, config: EngineConfig | None = None,
        speculation: SpeculationConfig | None = None, mode: str | None = None, k: int | None = None,
        **overrides,
    ):
        """`overrides` are EngineConfig fields (draft=, threads=, max_model_len=, dtype=, ...); `mode` and
        `k` set the SpeculationConfig (default: "sd" when a draft is given, else "ar")."""
        config = replace(config, **overrides) if config else EngineConfig(target=target, **overrides)
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.model_path: Path = resolve_model(config.target)
        files = inspect_model_dir(self.model_path)
        self.tokenizer = _load_tokenizer(self.model_path)
        self.device = torch.device(config.device)
        dtype = _dtype(config.dtype, self.device)
        model_max = int(files.config.get("max_position_embeddings", 4096))
        if config.max_model_len is not None and config.max_model_len > model_max:
            raise InvalidParameterError(
                f"max_model_len {config.max_model_len} exceeds the model's limit of {model_max} tokens"
            )
        self.max_model_len = config.max_model_len or model_max
        kv_tokens = config.kv_cache_tokens or 2 * self.max_model_len
        if kv_tokens < self.max_model_len:
            raise InvalidParameterError(
                f"kv_cache_tokens ({kv_tokens}) must be at least max_model_len ({self.max_model_len})"
            )
        log.info("loading %s (%s) on %s", config.target, self.model_path, self.device)
        model = build_model(
            files.config, files.weight_files, max_positions=self.max_model_len, dtype=dtype, device=self.device
        )
        self.model_args = model.args
        num_blocks = -(-kv_tokens // config.block_size)
        runner = ModelRunner(model, make_backend("sdpa"), num_blocks=num_blocks, block_size=config.block_size,
                             device=self.device, dtype=dtype)
        self.eos_token_ids = _eos_ids(self.model_path, model.args.eos_token_ids, self.tokenizer)
        drafter = None
        if config.draft is not None:
            drafter = self._load_draft(config.draft, num_blocks=num_blocks, dtype=dtype)
        self.core = EngineCore(
            runner, self._block_manager(num_blocks), max_model_len=self.max_model_len,
            max_num_seqs=config.max_num_seqs, eos_token_ids=self.eos_token_ids, drafter=drafter,
        )
        spec = speculation or SpeculationConfig(mode="sd" if drafter else "ar")
        self.speculation = replace(spec, **{n: v for n, v in (("mode", mode), ("k", k)) if v is not None})
        self._decode = make_decoder(self.tokenizer)
        self._ids = itertools.count()
        self._requests: dict[int, RequestState] = {}
        self._rng = torch.Generator().manual_seed(config.seed)

    def _block_manager(self, num_blocks: int) -> BlockManager:
        return BlockManager(num_blocks, self.config.block_size, enable_prefix_caching=self.config.enable_prefix_caching)

    def _load_draft(self, name: str, *, num_blocks: int, dtype: torch.dtype) -> SsdDrafter:
        self.draft_path = resolve_model(name)
        files = inspect_model_dir(self.draft_path)
        check_same_tokenizer(self.tokenizer, _load_tokenizer(self.draft_path), target=self.config.target, draft=name)
        log.info("loading draft %s (%s)", name, self.draft_path)
        model = build_model(
            files.config, files.weight_files, max_positions=self.max_model_len, dtype=dtype, device=self.device
        )
        if model.args.vocab_size != self.model_args.vocab_size:
            raise EngineError(
                f"draft {name} has a vocabulary of {model.args.vocab_size}, the target {self.model_args.vocab_size}:"
                " pick a draft of the same model family"
            )
        runner = ModelRunner(model, make_backend("sdpa"), num_blocks=num_blocks, block_size=self.config.block_size,
                             device=self.device, dtype=dtype, extra_slots=self.config.max_num_seqs * SCRATCH_SLOTS)
        return SsdDrafter(runner, self._block_manager(num_blocks), max_model_len=self.max_model_len,
                          max_num_seqs=self.config.max_num_seqs)

    @property
    def speculation(self) -> SpeculationConfig:
        """How new requests decode; set it between requests to switch modes (AR / SD / SSD)."""
        return self._speculation

    @speculation.setter
    def speculation(self, spec: SpeculationConfig) -> None:
        if spec.mode != "ar" and self.core.drafter is None:
            raise InvalidParameterError(f"mode {spec.mode!r} needs a draft model: pass --draft")
        self._speculation = spec

    # -- public API --------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None) -> list[RequestOutput]:
        """Run every prompt (text is tokenized as is, no chat template) to completion, batched."""
        batch = [prompts] if isinstance(prompts, str) or _is_token_ids(prompts) else list(prompts)
        states = [self._add(self._encode(p), params or SamplingParams()) for p in batch]
        while any(s.output is None for s in states):
            self._step()
        for s in states:
            s.drain()
        return [s.output for s in states]

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, *, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Token deltas, then one RequestFinished. Setting `cancel` (from any thread) or closing the
        generator ends the request and frees its KV blocks."""
        return self._stream(self._add(self._encode(prompt), params or SamplingParams()), cancel)

    def chat(
        self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Like `stream`, with the model's chat template applied to `messages`."""
        return self._stream(self._add(self.encode_chat(messages), params or SamplingParams()), cancel)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        _check_messages(messages)
        if not getattr(self.tokenizer, "chat_template", None):
            raise EngineError(f"{self.config.target} has no chat template: send raw prompts instead")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def weight_bytes(self) -> int:
        """Bytes of model weights one decode step reads (shared tensors counted once)."""
        params = self.core.runner.model.parameters()  # parameters() yields a tied tensor once
        return sum(p.numel() * p.element_size() for p in params)

    @property
    def layout(self) -> dict[str, str]:
        """Where the models run, for display: {"target": ..., "draft": ...} ("draft" only with a draft)."""
        threads = torch.get_num_threads()
        out = {"target": f"{self.config.target} on {self.config.device} (TP=1, {threads} threads)"}
        if self.config.draft is not None:
            out["draft"] = f"{self.config.draft} on {self.config.device} (in the target's process)"
        return out

    @property
    def num_forward_tokens(self) -> int:
        """Tokens that went through the model so far (prefix-cache hits do not count)."""
        return self.core.runner.num_forward_tokens

    def close(self) -> None:
        for state in list(self._requests.values()):
            self._finish(state, FinishReason.CANCELLED)

    # -- internals ---------------------------------------------------------------------------------
    def _stream(self, state: RequestState, cancel: threading.Event | None) -> Iterator[Event]:
        try:
            while state.output is None:
                if cancel is not None and cancel.is_set():
                    self._finish(state, FinishReason.CANCELLED)
                    break
                self._step()
                yield from state.drain()
            yield from state.drain()
        finally:
            if state.output is None:  # the consumer closed the generator mid-way
                self._finish(state, FinishReason.CANCELLED)

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if not _is_token_ids(prompt):
            raise InvalidParameterError("a prompt must be a string or a list of token ids")
        return list(prompt)

    def _add(self, token_ids: list[int], params: SamplingParams) -> RequestState:
        if not token_ids:
            raise InvalidParameterError("the prompt is empty: type something")
        vocab = self.model_args.vocab_size
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            raise InvalidParameterError(f"prompt token ids must be in [0, {vocab}) for this model")
        if len(token_ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(token_ids)} tokens but the context limit is {self.max_model_len}:"
                " shorten it, clear the conversation, or raise --max-model-len"
            )
        generator = None
        if not params.is_greedy:
            seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._rng))
            generator = torch.Generator().manual_seed(seed)
        seq = Sequence(next(self._ids), list(token_ids), params, generator)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        spec = self.speculation
        state = RequestState(seq, IncrementalDetokenizer(self._decode, params.stop), mode=spec.mode,
                             stop_ids=stop_ids, k=spec.k)
        self._requests[seq.seq_id] = state
        self.core.add(seq, spec)
        return state

    def _step(self) -> None:
        for seq, out in self.core.step().items():
            state = self._requests[seq.seq_id]
            keep = state.on_step(out)
            if state.hit_stop_string:
                self.core.stop_string_hit(seq, num_dropped=len(out.tokens) - keep)
            if seq.is_finished:
                self._requests.pop(seq.seq_id)
                state.finalize()

    def _finish(self, state: RequestState, reason: FinishReason) -> None:
        self.core.finish(state.seq, reason)
        if self._requests.pop(state.request_id, None) is not None:
            state.finalize()


def _is_token_ids(prompt: object) -> bool:
    return isinstance(prompt, list | tuple) and len(prompt) > 0 and all(isinstance(t, int) for t in prompt)


def _check_messages(messages: list[dict[str, str]]) -> None:
    if not messages:
        raise InvalidParameterError("the conversation is empty: add a user message")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise InvalidParameterError("each message needs a role of system, user or assistant")
        if not isinstance(m.get("content"), str):
            raise InvalidParameterError("each message needs a text content")


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _eos_ids(path: Path, from_config: tuple[int, ...], tokenizer) -> frozenset[int]:
    ids = set(from_config)
    gen_cfg = path / "generation_config.json"
    if gen_cfg.is_file():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


__all__ = ["LLM"]
