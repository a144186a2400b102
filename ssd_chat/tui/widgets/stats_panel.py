"""The side panel: live decode speed and speculation figures of the current reply, and where the
models run. Every section renders from one `PanelData` snapshot (see live_stats.py)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Digits, Sparkline, Static

from ssd_chat.history import ChatSettings
from ssd_chat.sampling_defaults import filters_text
from ssd_chat.setting_words import fanout_text, number_text
from ssd_chat.tui.live_stats import PanelData
from ssd_chat.tui.widgets.steady import set_content

BAR_WIDTH = 18
# A draft position's acceptance is shown from this many drafts there up: one or two read 0% or 100%, which says
# nothing about the draft (fewer show "–", as a position never drafted does)
MIN_POSITION_DRAFTS = 5


def _bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "·" * (width - filled)


def _opt(value: float | None, fmt: str, missing: str = "–") -> str:
    return missing if value is None else fmt.format(value)


def _threads_note(data: PanelData) -> str:
    """A line where the engine stepped with fewer threads than it has: other programs used its cores. (Short: the
    panel's 42 columns wrapped "other programs use the CPU" with "CPU" alone on a line.)"""
    if data.threads is not None and data.threads[0] < data.threads[1]:
        return f"\n{data.threads[0]} of {data.threads[1]} threads: the CPU is busy"
    return "\nfewer threads for a while: CPU busy" if data.fewer_threads else ""


class StatsPanel(VerticalScroll):
    can_focus = False

    def compose(self) -> ComposeResult:
        yield Static("decode tok/s", classes="section-title")
        yield Digits("0.0", id="tok-s")
        yield Sparkline([], id="rate-spark", summary_function=max)
        yield Static(id="speed")
        yield Static("speculation", classes="section-title")
        yield Static(id="spec")
        yield Static("accepted length per step", classes="section-title")
        yield Static(id="histogram")
        yield Static("acceptance per draft position", classes="section-title")
        yield Static(id="positions")
        yield Static("prefix cache", classes="section-title")
        yield Static(id="prefix")
        yield Static("device layout", classes="section-title")
        yield Static(id="layout")

    def on_mount(self) -> None:
        self.show(None)

    def show(self, data: PanelData | None) -> None:
        """Render one reply's figures (None: before the first reply)."""
        if data is None:  # no mode yet: the chat's may change before its first reply (the status line shows it)
            data = PanelData(mode="", k=0, tok_s=0.0, ttft_s=None, generated_tokens=0, rates=())
        self.query_one("#tok-s", Digits).update(f"{data.tok_s:.1f}")
        self.query_one("#rate-spark", Sparkline).data = list(data.rates)
        set_content(self.query_one("#speed", Static), Text(  # (each laid out only where its height changes)
            f"TTFT {_opt(data.ttft_s and 1000 * data.ttft_s, '{:.0f} ms')} · {data.generated_tokens} tokens"
            + _threads_note(data)
        ))
        set_content(self.query_one("#spec", Static), self._spec_text(data))
        set_content(self.query_one("#histogram", Static), self._histogram(data))
        set_content(self.query_one("#positions", Static), self._positions(data))
        reused = ("–" if data.reused_prefix_tokens is None or not data.prompt_tokens  # (0: the engine died, untold)
                  else f"{data.reused_prefix_tokens}/{data.prompt_tokens} prompt tokens reused")
        set_content(self.query_one("#prefix", Static), Text(reused))

    def show_layout(self, layout: dict[str, str], settings: ChatSettings, *, k: int) -> None:
        """Where the models run and the chat's settings, with `k` the most a round drafts (settings.k or a cap)."""
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold")
        table.add_column()
        for role in ("target", "draft"):
            table.add_row(role, Text(layout.get(role, "none (AR only)")))  # (a model's path is no markup)
        fanout = fanout_text(settings.fanout)
        spec = "" if settings.mode == "ar" else f" · k {k}"
        spec += f" · fan-out {fanout}" if settings.mode == "ssd" else ""
        table.add_row("mode", settings.mode.upper() + spec)
        filters = filters_text(settings.temperature, settings.top_p, settings.top_k, " · ", seed=settings.seed)
        table.add_row("temp", number_text(settings.temperature) + (f" · {filters}" if filters else ""))
        table.add_row("system", Text(" ".join(settings.system.split()), overflow="ellipsis", no_wrap=True)
                      if settings.system else Text("none", style="dim"))
        self.query_one("#layout", Static).update(table)

    @staticmethod
    def _spec_text(data: PanelData) -> Text:
        if not data.mode:
            return Text("no reply yet")
        if data.tau is None:
            return Text(f"{data.mode.upper()}: " + ("no drafts" if data.mode == "ar" or data.is_final else "waiting"))
        lines = [f"{data.mode.upper()}  tau {data.tau:.2f}  accepted {_opt(data.acceptance_rate, '{:.0%}')}"]
        if data.plain_steps:
            steps = "step" if data.plain_steps == 1 else "steps"
            lines.append(f"{data.plain_steps} {steps} without drafts (drafting did not pay)")
        if data.cache_hit_rate is not None:
            lines.append(f"cache hits {data.cache_hit_rate:.0%}")
            if data.tau_on_hit is not None or data.tau_on_miss is not None:  # (a saved reply's: not kept, not "–")
                lines.append(f"tau on hit {_opt(data.tau_on_hit, '{:.2f}')} · "
                             f"on miss {_opt(data.tau_on_miss, '{:.2f}')}")
        if data.verify_ms is not None:
            lines.append(f"per step: verify {data.verify_ms:.0f} ms · target waits {data.wait_ms:.0f} ms")
        if data.draft_idle_ms is not None:
            lines.append(f"draft process idle {data.draft_idle_ms:.0f} ms per step")
        return Text("\n".join(lines))

    @staticmethod
    def _histogram(data: PanelData) -> Text:
        if not data.histogram:
            return Text("–")
        total = sum(data.histogram) or 1
        rows = [f"{n:>2} {_bar(count / total)} {count}" for n, count in enumerate(data.histogram)]
        return Text("\n".join(rows))

    @staticmethod
    def _positions(data: PanelData) -> Text:
        if not data.per_position:
            return Text("–")
        rows = [f"{i + 1:>2} {_bar(rate)} {rate:.0%}" if rate is not None and drafts >= MIN_POSITION_DRAFTS
                else f"{i + 1:>2} {' ' * BAR_WIDTH} –"  # (–: too few drafts there, or none: the adaptive length)
                for i, (rate, drafts) in enumerate(zip(data.per_position, data.position_drafts, strict=True))]
        return Text("\n".join(rows))
