"""Where a decode step's GPU time goes: the target's captured forward under the profiler, kernel by kernel, and
each of its matmul shapes alone (F.linear) against the device's copy bandwidth.

    python scripts/gpu_profile.py            # a CUDA machine, about a minute (the 8B-shaped pair of gpu_check)
    python scripts/gpu_profile.py --smoke    # tiny shapes on the CPU: the script's own dry run (tests run it)

The forward profiled is the one a step replays (a CUDA graph of one row, and of five rows: k = 4's verification);
on the CPU, where there are no graphs, the eager forward of the same shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed_ms(fn, device: str, reps: int) -> float:
    """Mean wall time of `fn` over `reps` calls after one warm-up, the device synchronised around them."""
    fn()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return 1000 * (time.perf_counter() - start) / reps


def linear_rows(model: torch.nn.Module, device: str, copy_gb_s: float, reps: int) -> list[dict]:
    """Each distinct matmul weight shape alone: ms for 1 and 5 rows, and the weight bytes read per second."""
    rows, seen = [], set()
    for name, p in model.named_parameters():
        if p.dim() != 2 or tuple(p.shape) in seen or "embed" in name:
            continue
        seen.add(tuple(p.shape))
        for m in (1, 5):
            x = torch.randn(m, p.shape[1], device=device, dtype=p.dtype)
            ms = timed_ms(lambda x=x, p=p: F.linear(x, p), device, reps)
            gb_s = p.numel() * p.element_size() / ms / 1e6
            rows.append({"weight": name, "shape": list(p.shape), "rows": m, "ms": ms, "gb_s": gb_s,
                         "of_copy": gb_s / copy_gb_s})
    return rows


def kernel_table(step, device: str, reps: int) -> tuple[str, list[dict]]:
    """The profiler's per-kernel (per-op on the CPU) totals over `reps` steps, largest first."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    step()
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    found = sorted(({"name": e.key, "calls": e.count // reps, "us_per_step": getattr(e, attr, 0.0) / reps}
                    for e in events), key=lambda r: -r["us_per_step"])
    found = [r for r in found if r["us_per_step"] > 0]
    total = sum(r["us_per_step"] for r in found)
    lines = [f"{'us/step':>9} {'share':>6} {'calls':>5}  kernel"]
    lines += [f"{r['us_per_step']:9.1f} {r['us_per_step'] / total:6.1%} {r['calls']:5d}  {r['name'][:90]}"
              for r in found[:18]]
    lines.append(f"{total:9.1f} in all ({len(found)} kernels)")
    return "\n".join(lines), found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU allowed), for the test suite")
    p.add_argument("--out-dir", type=Path, default=None, help="where gpu_check's random pair is (built if missing)")
    p.add_argument("--json", type=Path, default=Path("gpu_profile.json"), help="results file")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("error: no CUDA device: run on a GPU machine, or pass --smoke for the CPU dry run", file=sys.stderr)
        return 2
    import gpu_check as gc  # scripts/, beside this file, is on the path when it runs as a script
    import gpu_pair as gp

    from engine import LLM, SamplingParams, smollm2

    device = "cuda:0" if cuda else "cpu"
    target, draft = (gp.SMOKE_TARGET, gp.SMOKE_DRAFT) if args.smoke else (gp.TARGET_8B, gp.DRAFT_1B)
    out_dir = args.out_dir or (smollm2.cache_root() / "gpu-check" / ("smoke" if args.smoke else "8b-1b"))
    pair = gp.build_pair(out_dir, target, draft, damping=0.05, smoke=args.smoke, device=device)
    reps = 3 if args.smoke else 20
    report: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    report["copy_gb_s"] = copy = gc.copy_bandwidth_gb_s(device, (64 << 20) if args.smoke else (4 << 30))
    with LLM(str(pair / "target"), dtype="float32" if args.smoke else "bfloat16", enable_prefix_caching=False,
             max_model_len=512 if args.smoke else 2048, target_devices=device if cuda else None) as llm:
        ids = llm.tokenizer.encode(gp.PROMPTS[0])
        llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))  # fills the buffers
        runner = llm.core.runner
        report["weight_bytes"] = llm.weight_bytes
        for rows in (1, 5):
            if runner.graphs is not None:
                shape = next(s for s in sorted(runner.graphs.replays) if s[0] == 1 and s[1] >= rows)  # shortest keys
                step = runner.graphs.replays[shape]
            else:
                chunk_ids = torch.tensor(ids[:rows] * (rows // len(ids[:rows]) + 1))[:rows]
                from engine.attention.base import SeqSpan, build_metadata

                meta = build_metadata(slice(0, rows), [SeqSpan(0, rows, slice(0, rows), rows)], device=device,
                                      batch_decode=False)
                step = lambda c=chunk_ids, m=meta, r=rows: runner.forward(c, torch.arange(r), m, runner.backend)  # noqa: E731
            with torch.inference_mode():
                ms = timed_ms(step, device, reps)
                table, kernels = kernel_table(step, device, reps)
            report[f"forward_{rows}"] = {"ms": ms, "of_copy": report["weight_bytes"] / ms / 1e6 / copy,
                                         "kernels": kernels[:40]}
            print(f"forward, {rows} row(s): {ms:.2f} ms ({report[f'forward_{rows}']['of_copy']:.0%} of the copy "
                  f"bandwidth for {report['weight_bytes'] / 1e9:.2f} GB of weights)\n{table}\n")
        with torch.inference_mode():
            report["linear"] = linear_rows(runner.model, device, copy, reps)
    print(f"{'weight':44} {'shape':>14} {'rows':>4} {'ms':>7} {'GB/s':>7} {'of copy':>7}")
    for r in report["linear"]:
        print(f"{r['weight'][:44]:44} {'x'.join(map(str, r['shape'])):>14} {r['rows']:4d} {r['ms']:7.3f} "
              f"{r['gb_s']:7.0f} {r['of_copy']:7.0%}")
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
