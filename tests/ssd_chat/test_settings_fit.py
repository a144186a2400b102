"""A chat's saved settings that the engine refuses go back to the run's defaults, as few of them as it takes."""

from __future__ import annotations

from dataclasses import replace

from engine.config import SpeculationConfig
from ssd_chat.history import ChatSettings
from ssd_chat.tui.settings_fit import fit

BASE = SpeculationConfig(mode="sd", k=4)
RUN = ChatSettings(mode="sd", k=4, temperature=0.2)  # what a new chat of this run starts with


def test_only_the_refused_setting_goes_back_to_the_runs_default():
    changes, notice = fit(ChatSettings(mode="sd", k=4, temperature=-1.0), BASE, RUN)
    assert changes == {"temperature": 0.2}  # the model's default, not ChatSettings' 0.7
    assert notice is not None and notice.endswith("it uses the default temperature 0.2 now (/temp sets it)")
    changes, notice = fit(ChatSettings(mode="xyz", k=4, temperature=0.5), BASE, RUN)
    assert changes == {"mode": "sd"}  # the valid temperature stays (it was reset on the way to the mode)
    fanned = ChatSettings(mode="ssd", k=2, fanout=(1, 2, 3, 4), temperature=0.5)  # k+1 = 3 needed
    assert fit(fanned, BASE, RUN)[0] == {"fanout": None}
    assert fit(ChatSettings(mode="sd", k=3, temperature=0.5), BASE, RUN) == ({}, None)


def test_a_refused_top_p_or_top_k_goes_back_to_the_runs():
    run = ChatSettings(mode="sd", k=4, temperature=0.2, top_p=0.9)
    changes, notice = fit(ChatSettings(mode="sd", k=4, temperature=0.5, top_p=1.5, top_k=20), BASE, run)
    assert changes == {"top_p": 0.9} and notice is not None and notice.endswith("top-p 0.9 now (/top-p sets it)")
    assert "(/top-p takes a mass in (0, 1], 1 = off; got 1.5)" in notice  # (the command, not SamplingParams' top_p)
    assert fit(ChatSettings(mode="sd", k=4, top_k=-3), BASE, run)[0] == {"top_k": 0}
    assert ChatSettings.from_dict({"mode": "sd", "temperature": 0.5}).top_p == 1.0  # saved before: what it ran with


def test_the_notice_names_every_refused_value_and_what_it_is_now():
    """A hand-edited chat with a bad top-p and a bad top-k: both went back to the defaults, but the notice named only
    the top-p; and the valid temperature beside them went back too (the resets ran in order, each with the ones
    before it)."""
    run = ChatSettings(mode="sd", k=4, temperature=0.2, top_p=0.9)
    changes, notice = fit(ChatSettings(mode="sd", k=4, temperature=0.5, top_p=1.5, top_k=-3), BASE, run)
    assert changes == {"top_p": 0.9, "top_k": 0}  # (the temperature, valid, stays)
    assert notice == ("this chat's settings are refused (/top-p takes a mass in (0, 1], 1 = off; got 1.5 · /top-k "
                      "takes a number of tokens, 0 = off; got -3): it uses the default top-p 0.9 and top-k 0 now "
                      "(/top-p, /top-k set them)")
    changes, notice = fit(ChatSettings.from_dict({"mode": "sd", "k": 40, "fanout": [1] * 41, "top_p": "0.9"}),
                          BASE, run)  # (a k past 32 with its k+1 fan-out; a top-p saved as text)
    assert changes == {"fanout": None, "k": 4, "top_p": 0.9} and notice is not None and "\n" not in notice
    assert "got 40" in notice and "/top-p takes a mass in (0, 1], 1 = off; got '0.9'" in notice
    assert notice.endswith(": it uses the default fan-out, k 4 and top-p 0.9 now (/fanout, /k, /top-p set them)")


def test_a_top_k_at_or_past_the_loaded_models_vocabulary_goes_back_to_the_runs():
    """A top-k of 100000 with SmolLM2's 49152 tokens filters nothing: refused once the vocabulary is known."""
    run = ChatSettings(mode="sd", k=4, top_k=20)
    wide = ChatSettings(mode="sd", k=4, top_k=49152)
    assert fit(wide, BASE, run) == ({}, None)  # (the model not loaded yet: no vocabulary to hold it to)
    changes, notice = fit(wide, BASE, run, vocab=49152)
    assert changes == {"top_k": 20} and notice == (
        "this chat's settings are refused (/top-k takes fewer tokens than the model's vocabulary of 49152 (0 turns it "
        "off); got 49152): it uses the default top-k 20 now (/top-k sets it)")
    assert fit(replace(wide, top_k=49151), BASE, run, vocab=49152) == ({}, None)


def test_a_saved_fanout_of_one_number_reads_as_a_one_number_fanout():
    """A hand-edited history with "fanout": 300 crashed --resume (TypeError: 'int' object is not iterable)."""
    settings = ChatSettings.from_dict({"mode": "ssd", "k": 4, "fanout": 300})
    assert settings.fanout == (300,)
    changes, notice = fit(settings, BASE, RUN)
    assert changes == {"fanout": None} and notice is not None and "/fanout takes counts from 0 to 256" in notice


def test_a_refused_seed_goes_back_to_the_runs():
    """A hand-edited seed of -1 passed fit and then failed the next reply (SamplingParams refused it)."""
    run = ChatSettings(mode="sd", k=4, temperature=0.2, seed=None)
    for bad in (-1, 2**63, "7"):
        changes, notice = fit(ChatSettings.from_dict({"mode": "sd", "k": 4, "temperature": 0.5, "seed": bad}), BASE,
                              run)
        assert changes == {"seed": None} and notice == (
            f"this chat's settings are refused (/seed takes a whole number from 0 to 2^63-1, last (the last reply's) "
            f"or off (a new seed each reply); got {bad!r}): it uses the default seed now (/seed sets it)")
    assert fit(ChatSettings(mode="sd", k=4, temperature=0.5, seed=2**63 - 1), BASE, run) == ({}, None)
