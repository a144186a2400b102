"""The CPU's model name for `ssd-chat bench`: /proc/cpuinfo's, macOS's sysctl brand string, else `platform`'s."""

from __future__ import annotations

import subprocess

import pytest

from engine import cpu_info


@pytest.fixture
def fresh(monkeypatch):
    cpu_info.model.cache_clear()
    yield monkeypatch
    cpu_info.model.cache_clear()


def test_linux_names_the_proc_cpuinfo_model(fresh):
    fresh.setattr(cpu_info, "field", lambda name: {"model name": "AMD EPYC 9R14"}.get(name, ""))
    assert cpu_info.model() == "AMD EPYC 9R14"


def test_macos_asks_sysctl(fresh):
    asked = []

    def sysctl(args, **kwargs):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, stdout="Apple M2 Pro\n")

    fresh.setattr(cpu_info, "field", lambda name: "")  # no /proc/cpuinfo
    fresh.setattr(cpu_info.sys, "platform", "darwin")
    fresh.setattr(cpu_info.subprocess, "run", sysctl)
    assert cpu_info.model() == "Apple M2 Pro"
    assert asked == [["sysctl", "-n", "machdep.cpu.brand_string"]]


def test_without_either_platform_names_it(fresh):
    fresh.setattr(cpu_info, "field", lambda name: "")  # ARM Linux: /proc/cpuinfo names no model
    fresh.setattr(cpu_info.sys, "platform", "linux")
    fresh.setattr(cpu_info.platform, "processor", lambda: "")
    fresh.setattr(cpu_info.platform, "machine", lambda: "aarch64")
    assert cpu_info.model() == "aarch64"


@pytest.mark.parametrize(("vendor", "family", "model", "halves"), [
    ("AuthenticAMD", "23", "1", True),     # Zen 1 (EPYC Naples)
    ("AuthenticAMD", "23", "24", True),    # Zen+ (Picasso)
    ("AuthenticAMD", "23", "49", False),   # Zen 2 (EPYC Rome): full-width units
    ("AuthenticAMD", "25", "1", False),    # Zen 3 (EPYC Milan)
    ("AuthenticAMD", "25", "17", False),   # Zen 4 (EPYC Genoa)
    ("HygonGenuine", "24", "0", True),     # Dhyana: a Zen 1
    ("GenuineIntel", "6", "207", False),   # Emerald Rapids
    ("", "", "", False),                   # no /proc/cpuinfo (macOS, ARM Linux)
])
def test_halves_256_bit_names_zen_1_class_cores(monkeypatch, vendor, family, model, halves):
    fields = {"vendor_id": vendor, "cpu family": family, "model": model, "model name": "a CPU"}
    monkeypatch.setattr(cpu_info, "field", lambda name: fields.get(name, ""))
    assert cpu_info.halves_256_bit() is halves
