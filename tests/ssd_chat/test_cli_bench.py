"""`ssd-chat bench` on a tiny random model: its results, its placements, and transformers' rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine import LLM
from ssd_chat import cli
from tests.ssd_chat.cli_runs import run_ssd_chat

runner = CliRunner()


def test_bench_writes_results_and_matches_transformers(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_llama_dir), "--modes", "ar", "--hf", "--max-tokens", "8", "--limit", "2",
            "--json", str(out)]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["machine"]) == {"cpu", "cores", "threads", "torch", "transformers", "python"}
    assert report["config"]["num_prompts"] == 2
    assert report["config"]["max_tokens"] == 8
    assert Path(report["config"]["model_path"]) == Path(tiny_llama_dir).resolve()
    ar, hf = report["results"]
    assert (ar["mode"], hf["mode"]) == ("ar", "hf")
    for row in (ar, hf):
        assert row["decode_tok_s"] > 0 and row["ttft_ms"] > 0
        assert [len(ids) for ids in row["outputs"]] == [8, 8]
    assert ar["identical_to_ar"] is None
    assert hf["identical_to_ar"] is True
    assert hf["outputs"] == ar["outputs"]
    assert "hf" in result.stdout


def test_bench_no_ignore_eos_stops_each_reply_at_its_end_of_turn(tiny_llama_dir, tmp_path):
    def bench(model: Path, out: Path, *extra: str) -> list[dict]:
        args = ["bench", "--target", str(model), "--max-tokens", "12", "--limit", "2", "--json", str(out), *extra]
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())["results"]

    fixed = bench(tiny_llama_dir, tmp_path / "fixed.json", "--modes", "ar")[0]["outputs"]
    end = fixed[0][3]  # a token the first greedy reply emits early: made the end of turn below
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    for name in ("config.json", "generation_config.json"):  # the engine reads both; transformers the second
        config = json.loads((model / name).read_text())
        config["eos_token_id"] = [end, config["eos_token_id"]]
        (model / name).write_text(json.dumps(config))
    rows = bench(model, tmp_path / "stopped.json", "--modes", "ar,sd", "--draft", str(model), "--hf",
                 "--no-ignore-eos")
    assert [r["mode"] for r in rows] == ["ar", "sd", "hf", "hf-assisted"]
    assert rows[0]["outputs"][0] == fixed[0][: fixed[0].index(end) + 1]
    assert all(r["outputs"] == rows[0]["outputs"] for r in rows)  # transformers stops at the same token
    assert bench(model, tmp_path / "ignored.json", "--modes", "ar")[0]["outputs"] == fixed


def test_bench_speculative_modes_report_tau_and_hits(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    draft = str(tiny_llama_dir)  # the target as its own draft: everything is accepted, the cache always hits
    args = ["bench", "--target", str(tiny_llama_dir), "--draft", draft, "--modes", "ar,sd,ssd", "--hf", "--k", "3",
            "--fixed-k", "--no-lookup", "--draft-weights", "float32", "--max-tokens", "12", "--limit", "2",
            "--cpu-matmul", "panel", "--json", str(out)]  # adaptive: k=1, so costly a draft; lookup off: the draft
    # alone is measured; the panel kernel (where it builds) in every mode: SD and SSD still equal AR and transformers
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["adaptive_k"] is False and report["config"]["lookup"] is False
    assert report["config"]["packed_kernel"] == "panel"
    config = report["config"]  # the bound: the weights read once per token at the faster of two read rates
    fastest = max(config["matvec_gb_s"], config["sum_gb_s"])
    rounding = 0.05 * 1e9 / config["weight_bytes"]  # the stored rates are rounded to 0.1 GB/s (a loaded CPU: 3 GB/s)
    assert config["bandwidth_bound_tok_s"] == pytest.approx(fastest * 1e9 / config["weight_bytes"], abs=rounding + 0.1)
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "sd", "ssd", "hf", "hf-assisted"]
    assert all(rows[m]["identical_to_ar"] for m in ("sd", "ssd", "hf", "hf-assisted"))
    assert rows["ar"]["tau"] is None and rows["ar"]["cache_hit_rate"] is None
    assert rows["sd"]["acceptance_rate"] == 1.0 and rows["sd"]["tau"] > 3.0
    assert rows["sd"]["cache_hit_rate"] is None
    assert rows["ssd"]["cache_hit_rate"] > 0.5 and rows["ssd"]["ideal_tok_s"] > 0
    assert rows["ar"]["round_ms"] is None and set(rows["sd"]["round_ms"]) >= {"verify", "wait", "plain"}
    ms, hit_rate = rows["ssd"]["round_ms"], rows["ssd"]["cache_hit_rate"]  # the split adds up to the mean wait
    plain = ms["plain"]  # (the rounds that drafted nothing: with a fixed k, a reply's last token alone)
    assert ms["verify"] > 0 and (1 - plain) * (hit_rate * ms["wait_on_hit"] + (1 - hit_rate) * ms["wait_on_miss"]) \
        + plain * ms.get("wait_on_plain", 0.0) == pytest.approx(ms["wait"])
    assert "\nsd per round: verify " in result.output and "\nssd per round: verify " in result.output
    assert "(cache hit " in result.output


def test_bench_places_the_draft_in_its_own_process_and_measures_every_core(tiny_llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    tiny = str(tiny_llama_dir)
    args = ["bench", "--target", tiny, "--draft", tiny, "--modes", "ar,ssd,ar-all,sd-all", "--k", "3",
            "--max-tokens", "12", "--limit", "2", "--target-devices", "cpu:0", "--draft-device", "cpu",
            "--threads", "1", "--fixed-k", "--json", str(out)]  # (adaptive, 12 tokens may all be plain steps)
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "ssd", "ar-all", "sd-all"]
    assert all(rows[m]["identical_to_ar"] for m in ("ssd", "ar-all", "sd-all"))
    assert rows["ssd"]["cache_hit_rate"] > 0.5
    assert rows["ar-all"]["tau"] is None and rows["sd-all"]["tau"] > 1.0  # the every-core SD row speculates
    assert rows["ar-all"]["row_cost"] is None and rows["sd-all"]["row_cost"] is not None  # fitted in SD rounds
    assert "own process" in report["config"]["layout"]["draft"]
    for mode in rows:  # each row's progress in its own name (the every-core rows' said "ar: prompt 1/2")
        assert f"{mode}: prompt 2/2" in result.stderr


def test_bench_every_core_row_keeps_the_fast_path_options(tiny_llama_dir, tmp_path, monkeypatch):
    from ssd_chat import bench

    seen = []

    def recording_llm(**kwargs):
        seen.append(kwargs)
        return LLM(**{**kwargs, "compile": False})  # the options arrive; no compile in this test

    monkeypatch.setattr(bench, "LLM", recording_llm)
    args = ["bench", "--target", str(tiny_llama_dir), "--modes", "ar,ar-all,ar", "--max-tokens", "4", "--limit", "1",
            "--compile", "--dtype", "float32", "--json", str(tmp_path / "b.json")]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert len(seen) == 2 and all(k["compile"] and k["dtype"] == "float32" for k in seen)  # (ar named twice: once)
    assert [r["mode"] for r in json.loads((tmp_path / "b.json").read_text())["results"]] == ["ar", "ar-all"]


def test_bench_samples_with_a_seed_per_prompt(tiny_llama_dir, tmp_path):
    tiny = str(tiny_llama_dir)

    def bench(*extra: str) -> tuple[dict, str]:
        out = tmp_path / "bench.json"
        args = ["bench", "--target", tiny, "--draft", tiny, "--draft-weights", "float32", "--max-tokens", "12",
                "--limit", "2", "--json", str(out), *extra]
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text()), result.output

    report, output = bench("--modes", "ar,sd", "--hf", "--temperature", "0.8", "--seed", "5")
    assert (report["config"]["temperature"], report["config"]["seed"]) == (0.8, 5)
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "sd", "hf", "hf-assisted"]
    assert report["config"]["sampler"] == "coupled"
    assert rows["sd"]["identical_to_ar"] is True  # the coupled race: one reply per seed in every mode
    assert rows["hf"]["identical_to_ar"] is None and rows["hf-assisted"]["identical_to_ar"] is None  # its own draws
    assert rows["sd"]["acceptance_rate"] == 1.0  # the target as its own draft: p = q, every draft accepted
    words = " ".join(output.split())  # (the title wraps at the runner's width)
    assert "sampled at temperature 0.8 (prompt i: seed 5 + i, coupled sampler)" in words
    assert "output = ar" in words and "greedy output" not in words
    rejection, output = bench("--modes", "ar,sd", "--temperature", "0.8", "--seed", "5", "--sampler", "rejection")
    assert rejection["config"]["sampler"] == "rejection"
    assert all(r["identical_to_ar"] is None for r in rejection["results"])  # the same distribution, not the tokens
    assert rejection["results"][1]["acceptance_rate"] == 1.0 and "output = ar" not in " ".join(output.split())
    assert rejection["results"][0]["outputs"] != rows["ar"]["outputs"]  # another sampler: other draws
    again, _ = bench("--modes", "ar", "--temperature", "0.8", "--seed", "5")
    other, _ = bench("--modes", "ar", "--temperature", "0.8", "--seed", "7")
    assert again["results"][0]["outputs"] == rows["ar"]["outputs"]  # seeded: the same replies
    assert other["results"][0]["outputs"] != rows["ar"]["outputs"]
    nucleus, output = bench("--modes", "ar", "--temperature", "0.8", "--seed", "5", "--top-p", "0.05")
    assert nucleus["config"]["top_p"] == 0.05 and "top-p 0.05" in " ".join(output.split())
    assert nucleus["results"][0]["outputs"] != rows["ar"]["outputs"]  # the nucleus: about the argmax alone


@pytest.mark.parametrize(("option", "value"), [("--temperature", "-1"), ("--temperature", "1e400"), ("--seed", "-3"),
                                              ("--seed", str(2**63 - 2)),  # (the 16 prompts' last seed: past 2^63-1)
                                              ("--top-p", "0"), ("--top-p", "1.5")])
def test_bench_refuses_bad_sampling_settings_before_loading(tiny_llama_dir, option, value):
    sampled = ["--temperature", "0.5"] if option != "--temperature" else []  # (a greedy bench draws no seed)
    args = ["bench", "--target", str(tiny_llama_dir), *sampled, option, value]
    if value in ("1e400", "-3"):  # refused as the option is read (cli_options.plain): typer's one line
        result = run_ssd_chat(*args)
        assert result.returncode == 2 and result.stderr.startswith(f"error: {option} ")
        assert value in result.stderr
        assert len(result.stderr.splitlines()) == 1 and "loading" not in result.stderr
        return
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "Traceback" not in result.output
    assert "loading" not in result.output
    if option != "--seed":  # (the option's name, not SamplingParams' field: top_p)
        assert result.output.startswith(f"error: {option} takes ")


def test_bench_over_a_half_kv_cache_records_it_and_sd_still_equals_ar_modes_in_any_case(tiny_llama_dir, tmp_path):
    out = tmp_path / "half.json"
    args = ["bench", "--target", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--modes", "AR,Sd", "--k", "3",
            "--fixed-k", "--draft-weights", "float32", "--max-tokens", "12", "--limit", "2", "--kv-dtype", "float16",
            "--json", str(out)]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["config"]["kv_dtype"] == "float16"
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["ar", "sd"]  # (--modes in any case, as --mode and /mode take them)
    assert rows["sd"]["identical_to_ar"] and rows["sd"]["tau"] > 1.0
