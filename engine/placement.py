"""Where each rank runs: `--tp`, `--target-devices`, `--draft-device`, `--threads`, checked up front.

Device sets read like `cpu:0-3`, `cpu:0,2`, `cpu` (every core), `cuda:0-3`, `cuda:4`. On the CPU, the
target's cores are split evenly over its TP ranks and every rank is a process pinned to its share;
the draft gets its own process on its cores. A placement that cannot work (more ranks than cores or
devices, a core or GPU that does not exist) is refused with one line that says what to pass instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine import affinity
from engine.errors import InvalidParameterError

_DEVICES = re.compile(r"^(cpu|cuda)(?::(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*))?$")


@dataclass(frozen=True)
class Device:
    kind: str                       # "cpu" | "cuda"
    cores: tuple[int, ...] | None   # CPU: the cores this rank is pinned to (None: not pinned)
    index: int | None = None        # CUDA: the GPU

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def __str__(self) -> str:
        if self.kind == "cuda":
            return f"cuda:{self.index}"
        return "cpu" if self.cores is None else f"cpu:{ranges(self.cores)}"


@dataclass(frozen=True)
class Placement:
    target: tuple[Device, ...]  # one per TP rank; rank 0 is the leader (the caller's process)
    draft: Device | None        # SSD's draft process; None: the draft runs in the leader's process
    threads: int | None         # torch threads per CPU rank (None: one per pinned core, or torch's default)

    @property
    def tp(self) -> int:
        return len(self.target)

    def threads_for(self, device: Device) -> int | None:
        if self.threads is not None:
            return self.threads
        return None if device.cores is None else len(device.cores)


def crowding(placement: Placement, usable: set[int]) -> str | None:
    """A warning where a placement makes its own threads wait for each other: SSD's draft process pinned to a
    core a pinned target rank also has, or more threads per rank than there are usable cores; else None."""
    draft = placement.draft
    if draft is not None and draft.kind == "cpu" and draft.cores is not None:
        shared = sorted(set(draft.cores) & {c for d in placement.target if d.kind == "cpu" for c in d.cores or ()})
        if shared:
            return (f"the draft process shares core(s) {ranges(shared)} with the target: SSD's drafting then slows "
                    "its verification; give --draft-device a core of its own")
    if placement.threads is not None and placement.threads > len(usable):
        return (f"--threads {placement.threads} is more than the {len(usable)} usable cores: threads will wait for "
                "each other; give at most one a core")
    return None


def off_the_draft(placement: Placement, affinity: set[int], threads: int) -> tuple[set[int], int] | None:
    """Where an unpinned one-rank target runs while SSD's draft process, pinned among its cores, is busy: the
    other cores, with at most `threads` threads; None when there is nothing to move off (a pinned target, TP,
    a GPU target, an unpinned draft process, or no other core)."""
    target, draft = placement.target[0], placement.draft
    if placement.tp > 1 or target.kind != "cpu" or target.cores is not None or draft is None or draft.cores is None:
        return None
    others = set(affinity) - set(draft.cores)
    return (others, min(threads, len(others))) if others else None


def plan(tp: int = 1, target_devices: str | None = None, draft_device: str | None = None,
         threads: int | None = None, default_device: str = "cpu") -> Placement:
    if tp < 1:
        raise InvalidParameterError(f"--tp takes a number of target ranks, at least 1; got {tp}")
    kind, ids = _parse(target_devices or default_device, "--target-devices")
    if kind == "cpu":
        if ids is None and tp > 1:
            ids = _cpus()
        if ids is not None and len(ids) < tp:
            given = f"--target-devices {target_devices} names" if target_devices else "this machine has"
            raise InvalidParameterError(
                f"--tp {tp} needs at least {tp} cores, {given} {len(ids)}:"
                f" lower --tp or give more cores (this machine has {ranges(_cpus())})"
            )
        target = tuple(Device("cpu", share) for share in _split(ids, tp)) if ids else (Device("cpu", None),) * tp
    else:
        ids = ids if ids is not None else [0]
        if len(ids) != tp:
            raise InvalidParameterError(
                f"--tp {tp} needs {tp} GPUs, --target-devices {target_devices or default_device} names {len(ids)}"
            )
        target = tuple(Device("cuda", None, i) for i in ids)
    draft = None
    if draft_device is not None:
        dkind, dids = _parse(draft_device, "--draft-device")
        if dkind == "cuda" and dids is not None and len(dids) != 1:
            raise InvalidParameterError(f"--draft-device takes one GPU (as cuda:1); got {draft_device!r}")
        draft = Device("cpu", None if dids is None else tuple(dids)) if dkind == "cpu" else \
            Device("cuda", None, (dids or [0])[0])
    if threads is not None and threads < 1:
        raise InvalidParameterError(f"--threads takes a number of CPU threads, at least 1; got {threads}")
    return Placement(target, draft, threads)


def _parse(text: str, option: str) -> tuple[str, list[int] | None]:
    m = _DEVICES.match(text.strip())
    if not m:
        raise InvalidParameterError(
            f"{option} takes cpu or cuda, or CPU cores or GPUs as cpu:0-3, cpu:0,2 or cuda:0-3; got {text!r}"
        )
    kind, spec = m.group(1), m.group(2)
    ids = None
    if spec is not None:
        ids = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if int(hi or lo) < int(lo):
                raise InvalidParameterError(f"{option}: the range {part} runs backwards: write {hi}-{lo}")
            ids += range(int(lo), int(hi or lo) + 1)
        if len(set(ids)) != len(ids):
            raise InvalidParameterError(f"{option} names a device twice: {text}")
    if kind == "cpu" and ids is not None:
        missing = [i for i in ids if i not in _cpus()]
        if missing:
            raise InvalidParameterError(
                f"{option}: core {missing[0]} does not exist here (usable cores: {ranges(_cpus())})"
            )
    if kind == "cuda":
        import torch  # here: plain CPU placements are read without it (ssd_chat.defaults, in the chat app's process)

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidParameterError(f"{option} {text}: this machine has no CUDA device; use cpu:N instead")
        bad = [i for i in (ids or [0]) if i >= count]
        if bad:
            raise InvalidParameterError(f"{option}: cuda:{bad[0]} does not exist (this machine has {count} GPUs)")
    return kind, ids


_MACHINE_CPUS = sorted(affinity.usable())  # before any engine pins this process


def _cpus() -> list[int]:
    return _MACHINE_CPUS


def _split(ids: list[int], parts: int) -> list[tuple[int, ...]]:
    """[0,1,2] over 2 parts -> (0, 1), (2,): contiguous, as even as possible, bigger shares first."""
    size, extra = divmod(len(ids), parts)
    out, start = [], 0
    for p in range(parts):
        n = size + (p < extra)
        out.append(tuple(ids[start : start + n]))
        start += n
    return out


def ranges(ids: tuple[int, ...] | list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5": the syntax of --target-devices."""
    ids = sorted(ids)
    runs, start = [], ids[0]
    for a, b in zip(ids, [*ids[1:], None], strict=True):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(runs)


def describe(placement: Placement, target: str, draft: str | None, *, remote: bool, threads: int,
             extras: str = "") -> dict[str, str]:
    """Where the models run, for display: {"target": ..., "draft": ...} ("draft" only with a draft). `threads`:
    torch's, where the placement sets none; `extras`: what the target's steps run with (", compiled")."""
    per_rank = placement.threads_for(placement.target[0]) or threads
    devices = ", ".join(str(d) for d in placement.target)
    out = {"target": f"{target} on {devices} (TP={placement.tp}, {per_rank} thread{'s' * (per_rank != 1)} per "
                     f"rank{extras})"}
    if draft is not None:
        where = f"in the target's process (SD) and in its own process on {placement.draft} (SSD)" if remote \
            else "in the target's process"
        out["draft"] = f"{draft} {where}"
    return out
