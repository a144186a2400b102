"""engine.interrupts.held: a Ctrl-C (or SIGTERM, SIGHUP) that comes inside the block is handled when it ends, so a
safetensors read is never cut (it turned the KeyboardInterrupt into an unrelated error)."""

from __future__ import annotations

import signal
import threading

import pytest
import torch

from engine import interrupts
from engine.loader import get_tensor


@pytest.fixture
def raising_sigterm():
    """SIGTERM raises KeyboardInterrupt (as ssd_chat.stop_signals makes it); the handler before comes back after."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    interrupt.hangups = []
    hangup = lambda *_: interrupt.hangups.append(1)  # noqa: E731
    before = signal.signal(signal.SIGTERM, interrupt), signal.signal(signal.SIGHUP, hangup)
    yield interrupt
    signal.signal(signal.SIGTERM, before[0])
    signal.signal(signal.SIGHUP, before[1])


def test_a_signal_inside_the_block_is_handled_when_it_ends(raising_sigterm):
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.held():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)  # another one: the first is the one handled
        done.append("the step")
    assert done == ["the step"] and raising_sigterm.hangups == []  # SIGTERM's handler, not SIGHUP's
    assert signal.getsignal(signal.SIGTERM) is raising_sigterm
    with interrupts.held():  # no signal: nothing happens
        done.append("again")
    assert done == ["the step", "again"]


def test_a_second_ctrl_c_interrupts_at_once():
    """A step can take long (a first compiled one): pressed twice, Ctrl-C does not wait for it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.held():
            signal.raise_signal(signal.SIGINT)
            done.append("held")
            signal.raise_signal(signal.SIGINT)
            done.append("never")
    finally:
        signal.signal(signal.SIGINT, before)
    assert done == ["held"]


def test_a_safetensors_read_finishes_before_the_interrupt(raising_sigterm):
    read = []

    class File:
        def get_tensor(self, name):
            signal.raise_signal(signal.SIGTERM)  # as a Ctrl-C lands while the extension calls back into Python
            read.append(name)  # the rest of the read is not cut
            return torch.ones(2)

    with pytest.raises(KeyboardInterrupt):
        get_tensor(File(), "w")
    assert read == ["w"]


def test_outside_the_main_thread_nothing_is_held(raising_sigterm):
    """Another thread cannot set handlers; the main thread's own run as they would."""
    seen = []

    def run():
        with interrupts.held():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [raising_sigterm]


def test_a_handler_left_in_place_by_a_race_passes_signals_on(raising_sigterm):
    """A signal racing the block's end can leave its stand-in installed; it must act as the handler it stood in for
    (it recorded into a list nobody read: every later SIGTERM was lost)."""
    with interrupts.held():
        stand_in = signal.getsignal(signal.SIGTERM)
    assert stand_in is not raising_sigterm
    with pytest.raises(KeyboardInterrupt):
        stand_in(signal.SIGTERM, None)


def test_a_block_inside_another_holds_until_the_outer_one_ends(raising_sigterm):
    """A step's cancels and a close's run inside held() blocks of their own: the signal waits for the outer end."""
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.held():
        with interrupts.held():
            signal.raise_signal(signal.SIGTERM)
        done.append("after the inner block")
    assert done == ["after the inner block"]
    assert signal.getsignal(signal.SIGTERM) is raising_sigterm
