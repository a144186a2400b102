"""The transcript: the conversation's messages (widgets.message_views), the last reply streaming in as Markdown.

An opened chat shows its last messages first, about SHOWN_SCREENS screens of them: laying a reply out draws it
whole (Rich's Markdown, code highlighted), 25-45 ms each on a 2-vCPU VM, so a 60-turn chat took 2.1 s to open.
The earlier ones are shown a batch at a time as the view nears the top (or at once, where a search or the turns
list asks for one of them), the view kept on the lines it showed. A chat typed in this run that grows past
RETIRE_SCREENS screens above the view, followed at its end, has its oldest messages unshown the same way: each
update that changes the reply's height lays out every message shown.
"""

from __future__ import annotations

import weakref

from textual.containers import VerticalScroll
from textual.widget import Widget

from ssd_chat.tui.widgets.message_views import AssistantMessage, EarlierMessages, Shown, UserMessage

__all__ = ["AssistantMessage", "EarlierMessages", "Shown", "Transcript", "UserMessage"]

SHOWN_SCREENS = 2  # an opened chat's messages shown at first, and each batch after: about this many screens
NEAR_TOP_SCREENS = 1  # the next batch is shown once the view is this close to the top
RETIRE_SCREENS = 6  # a live chat's messages this many screens above the view are unshown, down to SHOWN_SCREENS
KEEP_CHECKS = 3  # refreshes after a batch is mounted that the view is checked to have kept its place
PAGE_SPEED = 50  # rows a second: Textual's for a page, for the last one (scroll_end's default is a whole second)
FOUND_S = 3.0  # how long a chat opened from a search marks the message it matched


class Transcript(VerticalScroll):
    """Messages top to bottom; anchored to the bottom while a reply streams, unless scrolled up. An opened chat
    (`show`) keeps its earliest messages unshown until the view nears them (see the module's docstring)."""

    can_focus = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._hidden: list[Shown] = []  # the opened chat's messages not shown yet, oldest first
        self._earlier: EarlierMessages | None = None
        self._colours = False
        self._placing = False  # a batch was mounted, and the view not yet kept on its lines
        self._opened = 0  # chats shown (and views scrolled to) so far: a batch's checks end where it changed
        self._removed: weakref.WeakSet[Widget] = weakref.WeakSet()  # views removed here, until Textual has them
        self._page_up = False  # PageUp at the top: a page up once the batch it showed is in place

    def show(self, messages: list[Shown], *, colours: bool = False) -> None:
        """The transcript emptied, then `messages` (a chat just opened): the last SHOWN_SCREENS screens of them
        shown, the rest as the view nears the top."""
        self.remove_children()
        self._colours, self._earlier, self._placing, self._page_up = colours, None, False, False
        self._opened += 1
        count = self._batch(messages, minimum=2)
        self._hidden = messages[:len(messages) - count]
        self._sync_earlier()
        self.mount(*(self._view(m) for m in messages[len(messages) - count:]))
        self.anchor()
        if self._hidden:  # (shown ones shorter than guessed, under a screen: no scroll would bring the rest)
            self.call_after_refresh(self._keep_place, self._opened, 0.0, None, None, 1)

    @property
    def hidden(self) -> int:
        """How many of the opened chat's first messages are not shown yet."""
        return len(self._hidden)

    def reveal(self, count: int | None = None, *, keep: bool = True) -> None:
        """Show the last `count` unshown messages (None: all of them) above the shown ones, the view kept on the
        lines it shows (a scroll under way, PageUp's, goes on from there), unless not `keep` (the caller scrolls)."""
        count = len(self._hidden) if count is None else min(count, len(self._hidden))
        if count <= 0:
            return
        batch, self._hidden = self._hidden[len(self._hidden) - count:], self._hidden[:len(self._hidden) - count]
        scrolling = self.app.animator.is_being_animated(self, "scroll_y")
        target = self.max_scroll_y - self.scroll_target_y if scrolling else None
        self.mount(*(self._view(m) for m in batch), after=self._earlier)
        self._sync_earlier()
        if not keep:
            return
        self._placing = True
        below = max(0.0, self.max_scroll_y - max(0.0, self.scroll_y))
        self.call_after_refresh(self._keep_place, self._opened, below, target, self._last(), KEEP_CHECKS)

    def _last(self) -> tuple[Widget, int] | None:
        """The last view and its rows: a reply streaming into it grows it below the view while a batch comes above."""
        return (self.children[-1], self.children[-1].virtual_region_with_margin.height) if self.children else None

    def _keep_place(self, opened: int, below: float, target: float | None, last: tuple[Widget, int] | None,
                    checks: int) -> None:
        """The view `below` rows above the end again (the messages mounted above it pushed its lines down; the
        rows the `last` view, a streaming reply, grew by since are added to it), a scroll under way retargeted to
        `target` rows above the end; checked again after the next `checks - 1` refreshes (a batch may take more
        than one layout). Then, still near the top, the next batch (or PageUp's page). None for `last`: the end."""
        if opened != self._opened:  # (another chat was shown since, or the view was scrolled to a message)
            return
        now = self._last()
        if last is not None and (now is None or now[0] is not last[0]):  # (a message came or went at the end:
            self._placing = False  # the view is where that put it, following a new reply, say)
            return
        grown = 0 if last is None or now is None else now[1] - last[1]
        below, last = below + grown, now if last is not None else None
        target = None if target is None else target + grown
        y = self.max_scroll_y - below
        if below <= 0:  # (at the end: kept there, anchored as it was; scroll_to would let go of the anchor)
            self.scroll_end(animate=False, immediate=True)
        elif round(y) != round(self.scroll_y):
            self.scroll_to(y=y, animate=False, immediate=True)  # (it stops a scroll under way)
            if target is not None:
                self.scroll_to(y=self.max_scroll_y - target, animate=True)
        if checks > 1:
            self.call_after_refresh(self._keep_place, opened, below, target, last, checks - 1)
            return
        self._placing = False
        if self._page_up:
            self._page_up = False
            self.scroll_page_up()
        elif self._hidden and self.scroll_y <= NEAR_TOP_SCREENS * self.size.height:  # (still near the top)
            self.reveal(self._batch(self._hidden))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._hidden and not self._placing and new_value < old_value \
                and new_value <= NEAR_TOP_SCREENS * self.size.height:
            self.reveal(self._batch(self._hidden))

    def _batch(self, messages: list[Shown], minimum: int = 1) -> int:
        """How many of `messages`, from the last, fill about SHOWN_SCREENS screens (at least `minimum`)."""
        width = self.size.width or self.app.size.width
        height = self.size.height or self.app.size.height
        rows, count = 0, 0
        for message in reversed(messages):
            if count >= minimum and rows >= SHOWN_SCREENS * height:
                break
            rows, count = rows + message.rows(width), count + 1
        return count

    def _view(self, message: Shown) -> Widget:
        if message.role == "user":
            return UserMessage(message.text)
        pieces = None if message.pieces is None else list(message.pieces)
        return AssistantMessage(message.text, pieces, colours=self._colours, stats=message.stats)

    def _sync_earlier(self, above: Widget | None = None) -> None:
        """The line above the shown messages as `_hidden` has it: mounted where some are unshown (before `above`, the
        first shown view; None: after the views so far), with their count, and gone where none are."""
        if not self._hidden:
            if self._earlier is not None:
                self._earlier.remove()
                self._earlier = None
            return
        if self._earlier is None:
            self._earlier = EarlierMessages()
            self.mount(self._earlier, before=above)
        self._earlier.count(len(self._hidden))

    def _retire(self) -> None:
        """A live chat grown past RETIRE_SCREENS screens above the view, followed at its end: its oldest messages
        unshown, as an opened chat's earlier ones are, down to SHOWN_SCREENS screens above (every widget is laid out
        again at each update that changes the reply's height: under 60 long turns an update cost the UI thread 73
        ms against 15, scripts/ui_update_cost.py)."""
        height = self.size.height
        if not height or self._placing or not self.is_anchored or self._anchor_released \
                or self.max_scroll_y <= RETIRE_SCREENS * height:
            return
        shown = self._shown(None)
        if any(view in self._removed or not view.virtual_region.height for view in shown):
            return  # (F5 took the last turn out and it is still laid out, or a batch is not yet: the next prompt)
        above, count = self.max_scroll_y, 0
        for view in shown[:-2]:  # (the last turn stays: an edit marks it)
            rows = view.virtual_region_with_margin.height
            if above - rows < SHOWN_SCREENS * height:
                break
            above, count = above - rows, count + 1
        if not count:
            return
        for view in shown[:count]:
            self._hidden.append(view.shown())
            view.remove()
        self._sync_earlier(above=shown[count])

    def add_user(self, text: str) -> UserMessage:
        self._retire()
        message = UserMessage(text)
        self.mount(message)
        return message

    def add_assistant(self, text: str = "", *, colours: bool = False, stats: str = "") -> AssistantMessage:
        message = AssistantMessage(text, colours=colours, stats=stats)
        self.mount(message)
        self.anchor()
        return message

    def page(self, direction: int) -> None:
        """PageUp (-1) or PageDown (+1): scrolled up, it stops following a streaming reply; paged down to the end, it
        follows again. Where the page would not move (the conversation fits on the screen, or it is at the top) it
        does nothing: Textual lets go of the anchor on any scroll and takes it back only when the position changes,
        so a PageDown while a reply was short left the rest of it streaming below the screen."""
        if direction < 0:
            if self.scroll_y > 0:
                self.scroll_page_up()
            elif self._hidden and not self._placing:  # (at the top: the earlier messages, then a page up)
                self._page_up = True
                self.reveal(self._batch(self._hidden))
        elif self.scroll_y + self.scrollable_content_region.height >= self.max_scroll_y:
            self.scroll_end(speed=PAGE_SPEED)  # (the anchor kept or taken back: new output scrolls into view)
        else:
            self.scroll_page_down()

    def show_colours(self, colours: bool) -> None:
        self._colours = colours  # (and the earlier messages', when shown)
        for message in self.query(AssistantMessage):
            message.show_colours(colours)

    def views_of(self, start: int, count: int, total: int) -> list[Widget]:
        """The views of messages start..start+count of a chat of `total` messages, the unshown ones among them shown
        first: they are the last views (the chat shown before may not be removed yet)."""
        if start < len(self._hidden):
            self.reveal(len(self._hidden) - start, keep=False)  # (the caller shows them: a search's match)
        first = start - len(self._hidden)
        return self._shown(total)[first:first + count]

    def show_found(self, message: Widget, seconds: float = FOUND_S) -> None:
        """`message` scrolled to the top and marked for `seconds` (a search's match: the class "found")."""
        message.add_class("found")
        self.set_timer(seconds, lambda: message.remove_class("found"))
        self._opened += 1  # (a batch's checks pending would scroll back to where the view was)
        self._placing = False
        self.call_after_refresh(self.scroll_to_widget, message, animate=False, top=True)

    def last_assistant(self) -> AssistantMessage | None:
        found = self.query(AssistantMessage)
        return found.last() if found else None

    def remove_last(self, count: int) -> None:
        """Remove the last `count` messages (unshown ones too, where more than the shown ones)."""
        total = len(self._hidden) + len(self._shown(None))
        self.remove_messages(total - count, count, total)

    def remove_messages(self, start: int, count: int, total: int) -> None:
        """Remove messages start..start+count of a chat of `total` messages: unshown ones from the list, shown ones'
        views. Where no message stays shown, the next earlier ones come into view (a caller that shows more, a
        regenerated reply, leaves the view to follow it)."""
        hidden = len(self._hidden)
        shown = self._shown(total)
        gone = shown[max(0, start - hidden):max(0, start + count - hidden)]
        for view in gone:
            view.remove()
            self._removed.add(view)  # (Textual removes it after this handler: until then it is laid out still)
        del self._hidden[min(start, hidden):min(start + count, hidden)]
        self._sync_earlier()
        self.reveal(0 if len(gone) < len(shown) else self._batch(self._hidden, minimum=2), keep=False)

    def _shown(self, total: int | None) -> list[Widget]:
        """The views of the shown messages of a chat of `total` messages (None: all after the line above them); the
        chat shown before may not be removed yet: they are the last views."""
        views = list(self.children)
        if total is None:
            return views[views.index(self._earlier) + 1:] if self._earlier is not None else views
        count = total - len(self._hidden)
        return views[len(views) - count:] if count > 0 else []
