"""One GPU check, no downloads: random-weight models of real shapes, the GPU tests, then AR / SD / SSD decode speed.

    python scripts/gpu_check.py            # a CUDA machine, under 8 minutes; writes gpu_check.json
    python scripts/gpu_check.py --smoke    # tiny shapes, CPU allowed: the script's own logic in seconds

The target is Llama-3.1-8B-shaped, the draft Llama-3.2-1B-shaped, with random weights that agree on most greedy
tokens without training (gpu_pair, beside this file).
Reported: AR decode tok/s against the memory-bandwidth bound (weight bytes per token over the measured device
copy bandwidth; goal >= 85%), SD and SSD output identical to AR, and transformers' generate on the same weights.
SSD runs its draft on cuda:1 when there are two GPUs or more (else in the target's process: correctness only).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # (scripts/ too where a test loads this file by its path)

from gpu_pair import DRAFT_1B, PROMPTS, SMOKE_DRAFT, SMOKE_TARGET, TARGET_8B, build_pair  # noqa: E402 (after the path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes (CPU allowed), for the test suite")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the random models go (default: the ssd-chat cache; kept for reruns)")
    p.add_argument("--json", type=Path, default=Path("gpu_check.json"), help="results file")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens decoded per prompt (default 128, smoke 12)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    p.add_argument("--damping", type=float, default=0.05, help="scale of every layer's output projections")
    p.add_argument("--attention", default="auto", choices=("auto", "sdpa", "flashinfer"))
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                   help="the engine's and transformers' dtype (default bfloat16, smoke float32; TF32 stays off)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu")
    p.add_argument("--skip-hf", action="store_true", help="no transformers reference row")
    return p.parse_args(argv)


# -- measurements ------------------------------------------------------------------------------------
def copy_bandwidth_gb_s(device: str, num_bytes: int) -> float:
    """Best of 5 device-to-device copies; a copy reads and writes every byte (2 x num_bytes moved)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_gpu_tests() -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/engine/test_gpu.py"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"passed": False, "summary": "timed out after 300 s"}
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"passed": proc.returncode == 0, "summary": lines[-1] if lines else "", "returncode": proc.returncode}


def engine_rows(pair: Path, args, device: str, dtype: str, max_tokens: int, progress) -> tuple[list, dict]:
    from engine import LLM
    from engine.config import SpeculationConfig
    from ssd_chat.bench import BenchConfig, run_engine_mode

    common = dict(draft=str(pair / "draft"), dtype=dtype, attention=args.attention, eager=args.eager,
                  enable_prefix_caching=False, max_model_len=512 if args.smoke else 2048,
                  target_devices=device if device.startswith("cuda") else None)
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    rows, info, greedy = [], {}, BenchConfig(target=str(pair / "target"), max_tokens=max_tokens)
    with LLM(str(pair / "target"), **common) as llm:
        prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
        info = {"weight_bytes": llm.weight_bytes, "layout": llm.layout,
                "attention": llm.core.runner.backend.name, "cuda_graphs": llm.core.runner.graphs is not None}
        for mode in ("ar", "sd") + (() if gpus >= 2 else ("ssd",)):
            rows.append(run_engine_mode(llm, SpeculationConfig(mode=mode, k=args.k), prompt_ids, greedy, progress))
        if llm.core.runner.graphs is not None:  # rows per sequence -> replays: 1 = decode, more = verification
            info["graph_replays"] = dict(sorted(llm.core.runner.graphs.num_replays.items()))
            info["graph_forward_ms"] = graph_forward_ms(llm.core.runner.graphs)
    info["ssd_draft"] = "in the target's process (one device: correctness only)"
    if gpus >= 2:
        with LLM(str(pair / "target"), draft_device="cuda:1", **common) as llm:
            rows.append(run_engine_mode(llm, SpeculationConfig(mode="ssd", k=args.k), prompt_ids, greedy, progress))
        info["ssd_draft"] = "cuda:1, own process"
    return rows, {**info, "prompt_ids": prompt_ids}


def graph_forward_ms(graphs) -> dict[str, float]:
    """GPU time of one replay of the one-sequence graphs (the target's forward without the LM head, sampling or
    the host's step work): against the step time, what the rest of a step costs. Run after the modes (a replay
    writes K/V to the slots of the last step, which no later request reads before rewriting)."""
    found = {}
    for shape in ((1, 1), (1, 5)):
        shape = next((s for s in sorted(graphs.replays) if s[:2] == shape), None)  # the shortest key length
        if shape is None:
            continue
        graphs.replays[shape]()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graphs.replays[shape]()
        end.record()
        torch.cuda.synchronize()
        found[f"{shape[0]}x{shape[1]}, {shape[2]} keys"] = start.elapsed_time(end) / 20
    return found


def hf_row(target_dir: Path, prompt_ids: list[list[int]], device: str, dtype: torch.dtype, max_tokens: int) -> dict:
    """transformers' generate (greedy, EOS ignored) on the same weights: decode tok/s and its tokens."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from ssd_chat.bench import TimingStreamer

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)

    def generate(ids: list[int], streamer=None) -> list[int]:
        x = torch.tensor([ids], device=device)
        return model.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                              streamer=streamer)[0, len(ids):].tolist()

    generate(prompt_ids[0])  # warm-up: lazy allocations, kernel choice
    tokens, seconds, outputs = 0, 0.0, []
    for ids in prompt_ids:  # decode time: from the first new token to the last (generate syncs every token)
        streamer = TimingStreamer()
        outputs.append(generate(ids, streamer))
        tokens, seconds = tokens + len(outputs[-1]) - 1, seconds + streamer.times[-1] - streamer.first_token_time()

    @torch.inference_mode()
    def margins(ar: list[list[int]], other: list[list[int]]) -> list[dict | None]:
        """Per prompt, at the first token where `other` left AR: both tokens' logits there (AR's prefix, one
        forward) and the dtype's spacing at that size: a gap of a few spacings is a rounding tie, not a bug."""
        found = []
        for ids, a, b, at in zip(prompt_ids, ar, other, first_divergence(ar, other), strict=True):
            if at is None:
                found.append(None)
                continue
            logits = model(torch.tensor([ids + a[:at]], device=device)).logits[0, -1].float()  # [V]
            la, lb = logits[a[at]].item(), logits[b[at]].item()
            spacing = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(la), 1e-30)))
            found.append({"at": at, "ar_logit": la, "other_logit": lb, "gap": la - lb, "spacing": spacing})
        return found

    return {"mode": "hf", "decode_tok_s": tokens / seconds if seconds > 0 else 0.0, "outputs": outputs,
            "margins": margins}


def first_divergence(ar: list[list[int]], other: list[list[int]]) -> list[int | None]:
    """Per prompt, the index of the first token where `other` differs from AR (None where identical)."""
    found = []
    for a, b in zip(ar, other, strict=True):
        n = min(len(a), len(b))
        found.append(next((i for i in range(n) if a[i] != b[i]), None if len(a) == len(b) else n))
    return found


# -- the report --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("error: no CUDA device: run on a GPU machine, or pass --smoke for the CPU dry run", file=sys.stderr)
        return 2
    device = "cuda:0" if cuda else "cpu"
    dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 means float32
    max_tokens = args.max_tokens or (12 if args.smoke else 128)
    from engine import smollm2

    out_dir = args.out_dir or (smollm2.cache_root() / "gpu-check" / ("smoke" if args.smoke else "8b-1b"))
    progress = lambda msg: print(f"  {msg}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    target, draft = (SMOKE_TARGET, SMOKE_DRAFT) if args.smoke else (TARGET_8B, DRAFT_1B)
    progress(f"building random {'smoke' if args.smoke else '8B / 1B'}-shaped models in {out_dir}")
    pair = build_pair(out_dir, target, draft, damping=args.damping, smoke=args.smoke, device=device)
    tests = {"passed": None, "summary": "skipped"} if args.skip_tests else run_gpu_tests()
    progress(f"gpu tests: {tests['summary']}")
    rows, info = engine_rows(pair, args, device, dtype, max_tokens, progress)
    prompt_ids = info.pop("prompt_ids")
    bandwidth = copy_bandwidth_gb_s(device, (64 << 20) if args.smoke else (4 << 30))
    bound = bandwidth * 1e9 / info["weight_bytes"]
    ar = next(r for r in rows if r.mode == "ar")
    table = [{"mode": r.mode, "decode_tok_s": r.decode_tok_s, "of_bound": r.decode_tok_s / bound, "tau": r.tau,
              "acceptance": r.acceptance_rate, "identical_to_ar": None if r is ar else r.outputs == ar.outputs,
              "first_divergence": None if r is ar else first_divergence(ar.outputs, r.outputs), "outputs": r.outputs}
             for r in rows]
    if not args.skip_hf:
        progress("transformers reference")
        hf = hf_row(pair / "target", prompt_ids, device, getattr(torch, dtype), max_tokens)
        table.append({"mode": "hf", "decode_tok_s": hf["decode_tok_s"], "of_bound": hf["decode_tok_s"] / bound,
                      "tau": None, "acceptance": None, "identical_to_ar": hf["outputs"] == ar.outputs,
                      "first_divergence": first_divergence(ar.outputs, hf["outputs"]), "outputs": hf["outputs"]})
        for row in table[1:]:  # how close AR's choice was where another mode first left it (transformers' logits)
            row["margins"] = hf["margins"](ar.outputs, row["outputs"])
    goals = {"ar_at_85pct_of_bound": ar.decode_tok_s / bound >= 0.85,
             "sd_identical": all(t["identical_to_ar"] for t in table if t["mode"] == "sd"),
             "ssd_identical": all(t["identical_to_ar"] for t in table if t["mode"] == "ssd"),
             "gpu_tests_passed": tests["passed"]}
    report = {"machine": _machine(device), "smoke": args.smoke, "dtype": dtype, "max_tokens": max_tokens,
              "num_prompts": len(PROMPTS), "k": args.k, "target_shape": asdict(target), "draft_shape": asdict(draft),
              "copy_gb_s": bandwidth, "bandwidth_bound_tok_s": bound, **info, "rows": table, "tests": tests,
              "goals": goals, "seconds": time.perf_counter() - started}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    ok = goals["sd_identical"] and goals["ssd_identical"] and tests["passed"] is not False
    return 0 if ok else 1


def render(report: dict) -> str:
    lines = [f"{report['machine']['device']}: bound {report['bandwidth_bound_tok_s']:.0f} tok/s "
             f"({report['weight_bytes'] / 1e9:.2f} GB of weights, copy {report['copy_gb_s']:.0f} GB/s), "
             f"attention {report['attention']}, graphs {report['cuda_graphs']}, SSD draft {report['ssd_draft']}",
             f"{'mode':6} {'tok/s':>9} {'of bound':>9} {'tau':>6} {'accept':>7} {'= ar':>6}"]
    for r in report["rows"]:
        where = ",".join("-" if i is None else str(i) for i in r.get("first_divergence") or [])
        same = {None: "-", True: "yes", False: "NO@" + where}[r["identical_to_ar"]]
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        lines.append(f"{r['mode']:6} {r['decode_tok_s']:9.1f} {r['of_bound']:9.0%} {tau:>6} {acc:>7} {same:>6}")
        for m in r.get("margins") or []:
            if m is not None:
                lines.append(f"       left AR at token {m['at']}: logit gap {m['gap']:.4g} "
                             f"({m['gap'] / m['spacing']:.1f} {report['dtype']} spacings at {m['ar_logit']:.3g})")
    if report.get("graph_forward_ms"):
        step_ms = 1000 / report["rows"][0]["decode_tok_s"]
        lines.append("graph replay (GPU time of the forward): " + ", ".join(
            f"{k} {v:.2f} ms" for k, v in report["graph_forward_ms"].items()) + f"; AR step {step_ms:.2f} ms")
    lines.append("goals: " + ", ".join(f"{k}={v}" for k, v in report["goals"].items()))
    lines.append(f"gpu tests: {report['tests']['summary']}; {report['seconds']:.0f} s in all")
    return "\n".join(lines)


def _machine(device: str) -> dict:
    info = {"device": device, "torch": torch.__version__, "python": platform.python_version()}
    if device.startswith("cuda"):
        info |= {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                 "cuda": torch.version.cuda}
        try:
            import flashinfer

            info["flashinfer"] = flashinfer.__version__
        except ImportError:
            info["flashinfer"] = None
    return info


if __name__ == "__main__":
    sys.exit(main())
