"""What the CPU is, from /proc/cpuinfo: its vendor, model and feature flags (read once per field).

The engine picks its CPU kernels by them (engine.layers.packed_kernels), `ssd-chat bench` names the machine, and
`ssd-chat distill` trains in bfloat16 where the CPU has it natively. Off Linux every field is empty and the
callers fall back to `platform` (`model()`: to sysctl on macOS).
"""

from __future__ import annotations

import contextlib
import functools
import platform
import subprocess
import sys


@functools.cache
def field(name: str) -> str:
    """The first CPU's `name` field ("vendor_id", "model name", "flags", ...); "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def halves_256_bit() -> bool:
    """Whether the CPU runs each 256-bit vector operation as two 128-bit halves: AMD's Zen 1 and Zen+ (family 0x17,
    models below 0x30) and Hygon's Dhyana (family 0x18, a Zen 1). AVX2 code that pays on CPUs with full-width
    units may not pay there (engine.layers.low_bits: the int8 draft's panels). Intel's Atom cores (Gracemont) split
    them too and are not named here: not measured."""
    vendor, family, number = field("vendor_id"), field("cpu family"), field("model")
    if not (family.isdigit() and number.isdigit()):
        return False
    family_no, model_no = int(family), int(number)
    return (vendor == "AuthenticAMD" and family_no == 0x17 and model_no < 0x30) or (
        vendor == "HygonGenuine" and family_no == 0x18)


def flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo has none)."""
    return frozenset(field("flags").split())


@functools.cache
def model() -> str:
    """The CPU's model name: /proc/cpuinfo's on Linux x86, sysctl's brand string on macOS ("Apple M2 Pro"), else
    what `platform` knows ("aarch64" on ARM Linux, whose /proc/cpuinfo names no model)."""
    if field("model name"):
        return field("model name")
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            if brand:
                return brand
    return platform.processor() or platform.machine()
