"""Two windows (or processes) on one chat: a save writes only what changed since its base, nothing when nothing
did, and never writes over turns the other one saved (its own changed turns go to a copy instead)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from ssd_chat.history import ChatChanged, ChatMessage, ChatSettings, Conversation, HistoryStore
from ssd_chat.tui.session import ChatSession, copy_title


def _chat(store: HistoryStore) -> int:
    return store.save(Conversation(None, "Tea", ChatSettings(mode="sd"), [
        ChatMessage("user", "tea?"), ChatMessage("assistant", "yes, tea")]))


def _updated(store: HistoryStore, conversation_id: int) -> float:
    return next(s.updated for s in store.list() if s.id == conversation_id)


def _add_turn(store: HistoryStore, conversation_id: int, prompt: str) -> None:
    """Another process: load the chat, add a turn, save it."""
    there = store.load(conversation_id)
    there.messages += [ChatMessage("user", prompt), ChatMessage("assistant", f"re: {prompt}")]
    store.save(there)


def test_a_save_with_nothing_changed_writes_nothing(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat_id = _chat(store)
    before = _updated(store, chat_id)
    loaded = store.load(chat_id)
    base = store.load(chat_id)
    store.save(loaded, base)
    assert _updated(store, chat_id) == before  # the list's order and --resume's pick stay


def test_a_save_of_new_turns_appends_them(tmp_path):
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat_id = _chat(store)
    base, loaded = store.load(chat_id), store.load(chat_id)
    loaded.messages.append(ChatMessage("user", "more"))
    with store._db:  # no stored turn is deleted (and so none written again)
        store._db.execute("CREATE TRIGGER keep BEFORE DELETE ON messages BEGIN SELECT RAISE(ABORT, 'deleted'); END")
    store.save(loaded, base)
    assert store.load(chat_id).messages == loaded.messages and _updated(store, chat_id) > 0


def test_turns_another_window_saved_are_kept(tmp_path):
    path = tmp_path / "h.sqlite3"
    here, there = HistoryStore(path), HistoryStore(path)
    chat_id = _chat(here)
    base, mine = here.load(chat_id), here.load(chat_id)
    _add_turn(there, chat_id, "from there")
    mine.settings = ChatSettings(mode="ssd")  # no turn changed here: the settings are written, the turns stay
    here.save(mine, base)
    stored = there.load(chat_id)
    assert stored.settings.mode == "ssd"
    assert [m.content for m in stored.messages][-2:] == ["from there", "re: from there"]
    mine.messages.append(ChatMessage("user", "from here"))  # a turn of this window's on the old turns: refused
    with pytest.raises(ChatChanged):
        here.save(mine, base)
    assert there.load(chat_id) == stored


def test_a_title_renamed_elsewhere_is_not_written_back(tmp_path):
    path = tmp_path / "h.sqlite3"
    here, there = HistoryStore(path), HistoryStore(path)
    chat_id = _chat(here)
    base, mine = here.load(chat_id), here.load(chat_id)
    there.rename(chat_id, "Green tea")
    mine.messages.append(ChatMessage("user", "more"))
    here.save(mine, base)
    assert there.load(chat_id).title == "Green tea" and len(there.load(chat_id).messages) == 3


def test_a_session_on_a_chat_another_window_changed_goes_on_in_a_copy(tmp_path):
    path = tmp_path / "h.sqlite3"
    there = HistoryStore(path)
    chat_id = _chat(there)
    told: list[str] = []
    session = ChatSession(HistoryStore(path), ChatSettings(), on_copy=told.append)
    session.open(session.store.load(chat_id))
    _add_turn(there, chat_id, "from there")
    session.save()  # nothing changed here: nothing written, their turn stays
    assert len(there.load(chat_id).messages) == 4 and not told
    session.add_prompt("from here")
    session.add_reply("re: from here", None)
    assert [m.content for m in there.load(chat_id).messages] == ["tea?", "yes, tea", "from there", "re: from there"]
    copy_id = session.conversation.id
    assert copy_id != chat_id and session.conversation.title == "Tea (copy)"
    assert [m.content for m in there.load(copy_id).messages] == ["tea?", "yes, tea", "from here", "re: from here"]
    assert len(told) == 1 and '"Tea (copy)"' in told[0] and "another window" in told[0]
    session.add_prompt("again")  # the copy is this session's own: its next turns go there, with no other copy
    session.add_reply("re: again", None)
    assert len(there.load(copy_id).messages) == 6 and len(there.list()) == 2 and len(told) == 1


def test_a_chat_emptied_here_after_another_window_changed_it_makes_no_empty_copy(tmp_path):
    path = tmp_path / "h.sqlite3"
    store = HistoryStore(path)
    chat_id = _chat(store)
    session = ChatSession(HistoryStore(path), ChatSettings(), on_copy=lambda _: None)
    session.open(session.store.load(chat_id))
    _add_turn(store, chat_id, "from there")
    session.clear()  # their turns stay; this window goes on as a new, unsaved chat
    assert [s.id for s in store.list()] == [chat_id] and len(store.load(chat_id).messages) == 4
    session.add_prompt("coffee please")
    session.add_reply("coffee", None)
    new = [s for s in store.list() if s.id != chat_id]
    assert [s.title for s in new] == ["coffee please"]  # named by its first prompt (not "New chat (copy)")


def test_a_save_that_fails_leaves_the_base_as_it_was(tmp_path):
    """A write that fails (a full disk) is retried by the next save: the turns it did not write are still changes."""
    path = tmp_path / "h.sqlite3"
    store = HistoryStore(path)
    chat_id = _chat(store)
    session = ChatSession(store, ChatSettings())
    session.open(store.load(chat_id))
    other = sqlite3.connect(path)
    with other:
        other.execute("CREATE TRIGGER full BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    session.add_prompt("more")
    session.add_reply("re: more", None)
    assert len(store.load(chat_id).messages) == 2
    with other:
        other.execute("DROP TRIGGER full")
    other.close()
    session.save()
    assert len(store.load(chat_id).messages) == 4


def test_a_copy_of_a_copy_is_numbered():
    assert copy_title("Tea") == "Tea (copy)"
    assert copy_title("Tea (copy)") == "Tea (copy 2)" and copy_title("Tea (copy 2)") == "Tea (copy 3)"
    assert copy_title("Tea (copy 9)") == "Tea (copy 10)"
    assert copy_title("(copy)") == "(copy) (copy)"  # no title before it: a title of its own, copied
    assert copy_title("Tea (copyright)") == "Tea (copyright) (copy)"


def test_a_draft_kept_at_a_quit_brings_back_the_chat_another_window_deleted(tmp_path):
    """A quit's unsent text is the chat's draft (ChatSession.keep_draft): where another window deleted the chat
    meanwhile, the chat comes back with it, as a save of a change does, rather than the draft being refused (no chat
    to hold it); a blank input writes nothing, so another window's draft stays."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat_id = _chat(store)
    here, there = ChatSession(store, ChatSettings()), ChatSession(HistoryStore(store.path), ChatSettings())
    here.open(store.load(chat_id))
    there.open(there.store.load(chat_id))
    there.keep_draft("theirs")
    here.keep_draft("  \n")
    assert store.draft(chat_id).text == "theirs"
    store.delete(chat_id)
    here.keep_draft("mine")
    assert store.draft(chat_id).text == "mine"
    assert [m.content for m in store.load(chat_id).messages] == ["tea?", "yes, tea"]


def test_taking_a_draft_drops_its_empty_chat_but_never_one_with_turns(tmp_path):
    """A chat saved for its draft alone goes once the draft is back in the input (ChatSession.take_draft): not where
    another window saved a turn in it meanwhile, nor a chat with turns whose draft is taken."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    empty = Conversation(None)
    store.save(empty)
    store.save_draft(empty.id, "unsent")
    run = ChatSettings()  # (what the run starts a new chat with: the chats below have it)
    here = ChatSession(store, run)
    here.open(store.load(empty.id))
    _add_turn(HistoryStore(store.path), empty.id, "from there")  # (here still holds it empty)
    assert here.take_draft(run).text == "unsent" and here.conversation.id == empty.id
    assert store.load(empty.id).messages[0].content == "from there"
    chat_id = _chat(store)
    store.save_draft(chat_id, "more")
    here.open(store.load(chat_id))
    assert here.take_draft(run).text == "more" and here.conversation.id == chat_id and store.load(chat_id) is not None
    lone = Conversation(None)
    store.save(lone)
    store.save_draft(lone.id, "alone")
    here.open(store.load(lone.id))
    assert here.take_draft(run).text == "alone" and here.conversation.id is None and store.load(lone.id) is None
    here.keep_draft("alone")  # kept again at a quit: saved again, as a new chat
    assert here.conversation.id is not None and store.draft(here.conversation.id).text == "alone"
    cleared = Conversation(None, "Named, then cleared", ChatSettings(system="Be brief."))
    store.save(cleared)  # (as /clear leaves a chat: no turn, no draft; its title and settings the user's)
    here.open(store.load(cleared.id))
    assert here.take_draft(run).is_empty and here.conversation.id == cleared.id and store.load(cleared.id) is not None



def test_taking_a_draft_keeps_its_chat_where_it_has_a_title_or_settings_of_its_own(tmp_path):
    """A chat saved for its draft alone that was given a title (/rename before the quit, the picker's rename since) or
    settings (/temp, ...) went with the draft all the same, and a quit with the input empty lost them. Its max tokens
    are the run's, not its own: they keep nothing."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    run = ChatSettings(temperature=0.0, max_tokens=64)  # (what this run starts a new chat with)
    here = ChatSession(store, run)
    kept = {"titled": Conversation(None, "Tea for two", run), "set": Conversation(None, settings=replace(run, k=2)),
            "renamed": Conversation(None, settings=run)}
    for chat in (*kept.values(), lone := Conversation(None, settings=replace(run, max_tokens=512))):
        store.save(chat)
        store.save_draft(chat.id, "unsent")
    store.rename(kept["renamed"].id, "Named in the picker")
    for name, chat in kept.items():
        here.open(store.load(chat.id))
        assert here.take_draft(run).text == "unsent" and here.conversation.id == chat.id, name
        assert store.load(chat.id) is not None and store.draft(chat.id).is_empty, name
    here.open(store.load(lone.id))
    assert here.take_draft(run).text == "unsent" and here.conversation.id is None and store.load(lone.id) is None
    assert [c.title for c in store.list()] == ["Named in the picker", "New chat", "Tea for two"]

def test_undoing_a_delete_leaves_a_chat_another_window_brought_back_since(tmp_path):
    """A draft (or a reply) saved after Ctrl+O deleted the chat can only come from another window that had it open,
    whose save brings the chat back: the undo then failed with SQLite's "UNIQUE constraint failed". It leaves that
    chat as it is now, with the later draft."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat_id = _chat(store)
    store.save_draft(chat_id, "before the delete")
    there = ChatSession(HistoryStore(store.path), ChatSettings())
    there.open(there.store.load(chat_id))
    deleted = store.delete(chat_id)
    with pytest.raises(sqlite3.IntegrityError):  # (no draft without its chat: a draft alone cannot be written)
        there.store.save_draft(chat_id, "no chat to hold it")
    there.keep_draft("after the delete")
    assert store.restore(deleted) is False
    assert store.draft(chat_id).text == "after the delete" and len(store.load(chat_id).messages) == 2
    assert [s.id for s in store.list()] == [chat_id]
