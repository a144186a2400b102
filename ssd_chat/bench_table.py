"""`ssd-chat bench`'s table: one row per mode, with speed-ups against AR and transformers, speculation figures
(tau, acceptance, cache hits, SSD's ideal), the share of the bandwidth bound and the draft's per-token cost; and
under it, where a speculative round's time went (the target's verify, its wait for drafts)."""

from __future__ import annotations

from rich.table import Table

from ssd_chat.bench_results import BenchReport
from ssd_chat.setting_words import number_text


def render_table(report: BenchReport) -> Table:
    by_mode = {r.mode: r for r in report.results}
    ar, hf = by_mode.get("ar"), by_mode.get("hf")
    speculative = any(r.tau is not None for r in report.results)
    draft = f" / {report.config['draft']} (k={report.config['k']})" if report.config.get("draft") else ""
    temperature = report.config.get("temperature") or 0
    seed = report.config.get("seed")
    coupled = temperature != 0 and report.config.get("sampler", "rejection") == "coupled"  # (absent before it)
    top_p = report.config.get("top_p") or 1.0  # (None in reports from before it)
    nucleus = f", top-p {number_text(top_p)}" if top_p < 1 else ""
    decoding = ("greedy" if temperature == 0
                else f"sampled at temperature {number_text(temperature)}{nucleus} (prompt i: seed {seed} + i, "
                     f"{'coupled' if coupled else 'rejection'} sampler)")
    table = Table(title=f"{report.config['target']}{draft}: {report.config['num_prompts']} prompts x "
                        f"{report.config['max_tokens']} tokens, {decoding}")
    table.add_column("mode")
    table.add_column("decode tok/s", justify="right")
    table.add_column("TTFT ms", justify="right")
    if speculative:
        table.add_column("tau", justify="right")
        table.add_column("accept", justify="right")
        table.add_column("hit", justify="right")
        table.add_column("ideal tok/s (eff.)", justify="right")
    for base in (ar, hf):
        if base is not None:
            table.add_column(f"vs {base.mode}", justify="right")
    bound = report.config.get("bandwidth_bound_tok_s")
    if bound:
        table.add_column(f"of bw bound ({bound:.0f} tok/s)", justify="right")
    draft_cost = ar is not None and ar.decode_tok_s and any(r.draft_s_per_token for r in report.results)
    if draft_cost:
        table.add_column("draft cost / AR token", justify="right")
    same = temperature == 0 or coupled  # (sampled by the rejection rule: the same distribution, not the same tokens)
    if same:
        table.add_column("greedy output = ar" if temperature == 0 else "output = ar", justify="center")
    for r in report.results:
        row = [r.mode, f"{r.decode_tok_s:.1f}", f"{r.ttft_ms:.0f}"]
        if speculative:
            row += ["-" if r.tau is None else f"{r.tau:.2f}",
                    "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}",
                    "-" if r.cache_hit_rate is None else f"{r.cache_hit_rate:.0%}",
                    "-" if r.ideal_tok_s is None else f"{r.ideal_tok_s:.1f} ({r.decode_tok_s / r.ideal_tok_s:.0%})"]
        for base in (ar, hf):
            if base is not None:
                row.append(f"{r.decode_tok_s / base.decode_tok_s:.2f}x" if base.decode_tok_s else "-")
        if bound:
            row.append(f"{100 * r.decode_tok_s / bound:.0f}%")
        if draft_cost:
            row.append(f"1/{1 / (ar.decode_tok_s * r.draft_s_per_token):.1f}" if r.draft_s_per_token else "-")
        if same:
            row.append({None: "-", True: "yes", False: "[red]no[/red]"}[r.identical_to_ar])
        table.add_row(*row)
    return table


def round_lines(report: BenchReport) -> list[str]:
    """One line per speculative mode under the table: where its mean round's time went; one per mode whose engine
    stepped with fewer threads (another program used its cores: its figures are not a quiet machine's)."""
    lines = []
    for r in report.results:
        if r.fewer_threads_share:
            lines.append(f"{r.mode}: {r.fewer_threads_share:.0%} of its steps ran on fewer threads, as other programs "
                         "used the engine's cores (--fixed-threads keeps them)")
        ms = r.round_ms
        if ms is None:
            continue
        split = [f"{name} {ms['wait_on_' + name]:.1f}" for name in ("hit", "miss") if f"wait_on_{name}" in ms]
        detail = f" (cache {', '.join(split)})" if split else ""
        plain = f"; {ms['plain']:.0%} plain steps (k = 0)" if ms.get("plain") else ""
        lines.append(f"{r.mode} per round: verify {ms['verify']:.1f} ms + wait for drafts {ms['wait']:.1f} ms{detail}"
                     f"{plain}")
    return lines
