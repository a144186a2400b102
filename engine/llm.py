"""The public entry point: ``LLM`` loads a model and generates, streams or chats.

One LLM is driven by one thread at a time (the TUI runs it in a worker thread). Streams may be
interleaved: each request's events are buffered until its own consumer reads them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from engine import interrupts
from engine.build import check_tp, resolve_dtype, warn_slow_compile, weight_bytes
from engine.chat import encode_chat, encode_prompt, is_token_ids
from engine.config import DEFAULT_TARGET, EngineConfig, SpeculationConfig, check_has_draft
from engine.core_share import CoreShare
from engine.detokenizer import IncrementalDetokenizer, make_decoder, make_tail_check
from engine.errors import EngineError, InvalidParameterError
from engine.layers.packed import runs_q8
from engine.model_dir import inspect_model_dir
from engine.outputs import ALSO_AN_EVENT, Event, FinishReason, RequestOutput
from engine.placement import describe, plan
from engine.registry import resolve_model
from engine.remote_drafter import RemoteDrafter
from engine.request import RequestState, check_prompt
from engine.sampling_params import SamplingParams
from engine.sequence import SeqStatus, Sequence
from engine.startup import Sizes, check_draft, context_sizes, draft_process_starts, load_tokenizer, start_engine
from engine.tp_worker import stop_ranks

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
        self.placement = plan(config.tp, config.target_devices, config.draft_device, config.threads,
                              default_device=config.device)
        self.core_share = CoreShare(self.placement, adapt=config.adapt_threads and not config.on_cuda,
                                    companions=config.companion_pids)
        self._open = True
        self._cut = False  # a second Ctrl-C stopped a step half-way: the scheduler's state is unknown from then on
        self._stepping = threading.RLock()  # a step's; close() from another thread waits for the step to end
        self._workers: list = []
        self.core = None  # (until start_engine; close() may run before it)
        self.remote: RemoteDrafter | None = None
        self._requests: dict[int, RequestState] = {}
        self.model_path: Path = resolve_model(config.target)
        files = inspect_model_dir(self.model_path)
        tokenizer = functools.cache(lambda: load_tokenizer(self.model_path))  # (after SSD's draft process starts)
        self.device = torch.device(self.placement.target[0].torch_device)
        warn_slow_compile(config, self.device)
        dtype = resolve_dtype(config.dtype, self.device)
        self.max_model_len, self.model_max_len, num_blocks = context_sizes(config, files.config)
        check_tp(files.config, self.placement.tp, config.target)
        self.draft_path = None if config.draft is None else check_draft(config, self.model_path, tokenizer)
        try:
            self.core_share.pin_leader()
            if draft_process_starts(config, self.placement):  # (SSD's draft process loads beside:
                self.core_share.share(True)  # off its cores until it is up, or the target's threads wait for it)
            self.core_share.idle()  # (the load's work is this process's or its children's: a pause like any other)
            started = start_engine(config, self.placement, files, self.model_path, self.draft_path, tokenizer,
                                   Sizes(num_blocks, self.max_model_len, dtype), self._workers)
            self.core, self.model_args, self.remote = started.core, started.model_args, started.remote
            self.eos_token_ids = started.eos_token_ids
            spec = speculation or SpeculationConfig(mode="sd" if config.draft else "ar")
            self.speculation = replace(spec, **{n: v for n, v in (("mode", mode), ("k", k)) if v is not None})
            self.tokenizer = tokenizer()  # (loaded by start_engine)
        except BaseException:  # e.g. mode "ssd" without a draft: stop what started, unpin
            self.close()
            raise
        self._decode = make_decoder(self.tokenizer)
        self._ends_inside_a_character = make_tail_check(self.tokenizer)
        self._ids = itertools.count()
        # a sampled request without a seed of its own draws from here: other draws in every run unless config.seed
        self._rng = torch.Generator().manual_seed(config.seed if config.seed is not None else secrets.randbits(62))

    @property
    def speculation(self) -> SpeculationConfig:
        """How new requests decode; set it between requests to switch modes (AR / SD / SSD)."""
        return self._speculation

    @speculation.setter
    def speculation(self, spec: SpeculationConfig) -> None:
        check_has_draft(spec.mode, self.core.drafter is not None)
        self._speculation = spec
        self._share_cores()

    def _share_cores(self) -> None:
        """The target off SSD's draft cores while SSD runs on the draft process (engine.core_share)."""
        serving = self.remote is not None and self.core.drafters.get("ssd") is self.remote
        self.core_share.share(self._open and self.speculation.mode == "ssd" and serving)
        if not self._requests:  # (loaded, or a mode switched between replies: the pause from here is idle)
            self.core_share.idle()

    # -- public API --------------------------------------------------------------------------------
    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text is tokenized as is, no chat template) to completion, batched. ``params`` is
        one SamplingParams for all prompts or a list of one per prompt (e.g. a seed each)."""
        batch = [prompts] if isinstance(prompts, str) or is_token_ids(prompts) else list(prompts)
        per_prompt = params if isinstance(params, list) else [params or SamplingParams()] * len(batch)
        if len(per_prompt) != len(batch):
            raise InvalidParameterError(f"got {len(per_prompt)} SamplingParams for {len(batch)} prompts: "
                                        "give one, or one per prompt")
        states = [self._add(encode_prompt(self.tokenizer, p), q) for p, q in zip(batch, per_prompt, strict=True)]
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
        return self._stream(self._add(encode_prompt(self.tokenizer, prompt), params or SamplingParams()), cancel)

    def chat(
        self, messages: list[dict[str, str]], params: SamplingParams | None = None, *,
        cancel: threading.Event | None = None, continue_reply: bool = False,
    ) -> Iterator[Event]:
        """Like `stream`, with the model's chat template applied to `messages`; `continue_reply`: the last message
        is an assistant reply to go on with (engine.chat.encode_chat)."""
        prompt = self.encode_chat(messages, continue_reply=continue_reply)
        return self._stream(self._add(prompt, params or SamplingParams()), cancel)

    def encode_chat(self, messages: list[dict[str, str]], *, continue_reply: bool = False) -> list[int]:
        return encode_chat(self.tokenizer, messages, model=self.config.target, continue_reply=continue_reply)

    @property
    def weight_bytes(self) -> int:
        """Bytes of model weights one decode step reads (engine.build.weight_bytes)."""
        return weight_bytes(self.core.runner.model)

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary: the tokens it scores each step (a top_k at or past it filters nothing)."""
        return self.model_args.vocab_size

    @property
    def layout(self) -> dict[str, str]:
        """Where the models run, for display: {"target": ..., "draft": ...} ("draft" only with a draft)."""
        compiled = self.core.runner.compiled
        fast = ", compiled" if compiled is not None and compiled.available else ""
        fast += ", 8-bit activations (q8)" if runs_q8(self.core.runner.model) else ""  # not the float32 bits
        fast += ", half KV cache" if self.config.kv_dtype == "float16" else ""  # (--kv-dtype; auto: the model's)
        return describe(self.placement, self.config.target, self.config.draft, remote=self.remote is not None,
                        threads=self.core_share.step_threads, extras=fast)

    @property
    def num_forward_tokens(self) -> int:
        """Tokens that went through the model so far (prefix-cache hits do not count)."""
        return self.core.runner.num_forward_tokens

    def close(self) -> None:
        """Cancel open requests, stop the draft and TP processes, and unpin this process. Idempotent; from another
        thread than the one stepping a request, it waits for the step under way (the request ends as cancelled)."""
        self._open = False
        with self._stepping, interrupts.held():  # a Ctrl-C waits for the close (a second one: not)
            self._close()

    def _close(self) -> None:
        try:
            self._cancel_all()
            if self.remote is not None:
                self.remote.close()
            self._stop_workers()
        finally:
            self.core_share.restore()

    def _stop_workers(self) -> None:
        """Stop the TP ranks: told to, or killed at once after a cut step (each is mid-collective: a STOP would
        meet its all-reduce and wait there)."""
        stop_ranks(self._workers, None if self.core is None else self.core.runner, cut=self._cut)
        self._workers = []

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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

    def _add(self, token_ids: list[int], params: SamplingParams) -> RequestState:
        if not self._open:
            raise EngineError("the engine was closed: start a new one")
        if self._cut:
            raise EngineError("a second Ctrl-C stopped the engine in the middle of a step: close it and start a new "
                              "one")
        check_prompt(token_ids, self.model_args.vocab_size, self.max_model_len, self.model_max_len)
        generator, seed = None, None
        if not params.is_greedy:
            seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._rng))
            if params.sampler == "rejection":  # (the coupled race keys on the seed itself: Sequence.noise_key)
                generator = torch.Generator().manual_seed(seed)
        seq = Sequence(next(self._ids), list(token_ids), params, generator, seed=seed)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        spec = self.speculation
        detokenizer = IncrementalDetokenizer(self._decode, params.stop, self._ends_inside_a_character)
        state = RequestState(seq, detokenizer, mode=spec.mode, stop_ids=stop_ids, k=self.config.drafted_k(spec.k))
        self._requests[seq.seq_id] = state  # (on fewer threads, its first step tells it so before its tokens)
        self.core.add(seq, spec)
        self._report_warnings()  # (a mode whose draft process was lost: its warning, and the state reports AR)
        return state

    def _report_warnings(self) -> None:
        if self.core.warnings and self.core_share.yielded:  # perhaps the draft process was lost: take its cores back
            self._share_cores()
        for warning in self.core.warnings:
            state = self._requests.get(warning.request_id)
            log.warning("request %d: %s", warning.request_id, warning.message, extra={ALSO_AN_EVENT: state is not None})
            if state is not None:
                state.events.append(warning)
                if warning.draft_lost:
                    state.fell_back_to_ar()
        self.core.warnings.clear()

    def _step(self) -> None:
        self.core_share.sync_thread()  # (a step on another thread would take torch's default: one thread a core)
        for state in self._requests.values():  # (each hears of a change of the count it steps on)
            self.core_share.tell(state)
        # close() from another thread waits for this step; a Ctrl-C lands between steps (engine.interrupts), so
        # the engine stays whole (SSD's draft process mid-round went out of step: close() then waited 2 minutes)
        with self._stepping, interrupts.held():
            if not self._open:  # closed from another thread since the last step: the requests end as cancelled
                self._cancel_all()
                return
            try:
                outputs = self.core.step()
                self.core_share.stepped()
            except KeyboardInterrupt:  # a second Ctrl-C cut the step: its lists and SSD's draft process half-way
                self._cut = True
                if self.remote is not None:
                    self.remote.drop()
                self._stop_workers()
                raise
            self._report_warnings()
            for seq in self.core.part_prefilled:
                self._requests[seq.seq_id].on_prefill_chunk()
            for seq, out in outputs.items():
                state = self._requests[seq.seq_id]
                keep = state.on_step(out)
                if state.hit_stop_string:
                    self.core.stop_string_hit(seq, num_dropped=len(out.tokens) - keep)
                if seq.is_finished:
                    self._retire(state)

    def _cancel_all(self) -> None:
        for state in list(self._requests.values()):
            self._finish(state, FinishReason.CANCELLED)

    def _finish(self, state: RequestState, reason: FinishReason) -> None:
        if not self._cut:
            with interrupts.held():  # (a second Ctrl-C in a cancel's bookkeeping: after it, as in a step)
                self.core.finish(state.seq, reason)
        elif not state.seq.is_finished:  # the scheduler's lists are not to be trusted: only the request ends
            state.seq.status, state.seq.finish_reason = SeqStatus.FINISHED, reason
        if state.request_id in self._requests:
            self._retire(state)

    def _retire(self, state: RequestState) -> None:
        """An open request ends (finished or cancelled): its output is final, and the engine idle once it was the
        last (the governor reads the pause from here)."""
        self._requests.pop(state.request_id)
        state.finalize()
        if not self._requests:
            self.core_share.idle()


__all__ = ["LLM"]
