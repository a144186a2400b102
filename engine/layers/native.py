"""Building and loading the CPU kernels' library (engine/kernels/: the panel GEMMs, RMSNorm, row attention, the
fused layer front; engine/layers/panel.py, norm.py, attention/sdpa.py and fused.py call it).

The library is compiled on first use with the system's C++ compiler (``$CXX`` or ``c++``, a few seconds) into the
user cache (``ssd-chat/kernels``), keyed by the source, the flags and the compiler, and loaded with ctypes: for NEON
on AArch64; on x86 for AVX-512 where the CPU has it, else for AVX2 with FMA (``$SSD_CHAT_CPU_ISA=avx2`` takes the
AVX2 build on an AVX-512 CPU too, ``none`` none of them); the same bits on all (simd.h). With OpenMP where the
compiler has it, else (Apple's clang) against the libomp torch ships, else single-threaded. Without any of these
instruction sets, a compiler, or a build that works, `library()` is None and the engine keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import cpu_info

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "panel_gemm.cpp"
SOURCES = (SOURCE, SOURCE.with_name("rms_norm.cpp"), SOURCE.with_name("attention.cpp"),
           SOURCE.with_name("layer.cpp"), SOURCE.with_name("q8_gemm.cpp"),
           SOURCE.with_name("q8_avx2.cpp"), SOURCE.with_name("sampling.cpp"))  # one library, all rows alike
HEADERS = (SOURCE.with_name("simd.h"), SOURCE.with_name("threads.h"), SOURCE.with_name("q8.h"),
           SOURCE.with_name("attention_tile.h"))
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma"), "avx2": ("-mavx2", "-mfma", "-mf16c"), "neon": ()}  # best first
# x86 (F16C: half-precision KV; every AVX2 CPU has it); every AArch64 CPU has NEON, FMA and half conversions
ISA_CPU_FLAGS = {"avx512": {"avx512f", "fma"}, "avx2": {"avx2", "fma", "f16c"}}
ARM = ("aarch64", "arm64")  # platform.machine() on AArch64 Linux, macOS
# no contraction of a separate multiply and add into an FMA: the kernels say where they fuse
FLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC")
ISA_ENV = "SSD_CHAT_CPU_ISA"


def cpu_isas() -> list[str]:
    """The instruction sets in ISA_FLAGS this CPU runs, best first: ["neon"] on AArch64 (Apple silicon, ARM
    servers), the x86 ones it has elsewhere ("avx512", "avx2"; none on an x86 CPU without AVX2 + FMA)."""
    if platform.machine().lower() in ARM:
        return ["neon"]
    return [name for name, need in ISA_CPU_FLAGS.items() if need <= cpu_info.flags()]


@functools.cache
def isa() -> str | None:
    """The instruction set the kernels are built for: the best of `cpu_isas()`, or ``$SSD_CHAT_CPU_ISA`` where the
    CPU has that one; None where it has none, or ``$SSD_CHAT_CPU_ISA=none`` (none of our kernels: MKL's or
    oneDNN's, as on a CPU without them)."""
    have = cpu_isas()
    wanted = os.environ.get(ISA_ENV, "").strip().lower()
    if wanted == "none":
        return None
    if wanted in have:
        return wanted
    if wanted:
        log.warning("%s=%s: this CPU runs %s; using %s", ISA_ENV, wanted, " or ".join(have) or "no kernel set",
                    have[0] if have else "MKL / oneDNN")
    return have[0] if have else None


def cache_dir() -> Path:
    """Where built kernels live: ``$SSD_CHAT_KERNEL_CACHE``, else the user cache's ``ssd-chat/kernels``."""
    if os.environ.get("SSD_CHAT_KERNEL_CACHE"):
        return Path(os.environ["SSD_CHAT_KERNEL_CACHE"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ssd-chat")) / "kernels"


def forget() -> None:
    """Drop the chosen instruction set and the loaded kernels (tests: another compiler or CPU next time)."""
    for cached in (isa, build, library):
        cached.cache_clear()


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernels for this CPU (`isa()`), built and loaded; None where there are none."""
    target = isa()
    return None if target is None else build(target)


def q8_support() -> int:
    """Which 8-bit-activation code (engine/kernels/q8_gemm.cpp, --cpu-matmul q8) runs here, as the library finds
    the CPU: 2 AVX-512 VNNI and VBMI, 1 AVX2 and FMA (q8_avx2.cpp: the same bits), 0 none (no x86, or no kernels)."""
    lib = library()
    return 0 if lib is None else int(lib.q8_support())


def q8_available() -> bool:
    """Whether --cpu-matmul q8 runs here (`q8_support`)."""
    return q8_support() > 0


def q8_vnni() -> bool:
    """Whether q8 runs its AVX-512 VNNI code here (where the int8 draft takes the panels too: measured faster)."""
    return q8_support() == 2


@dataclass(frozen=True)
class OpenMP:
    """A way to build the kernels with OpenMP: its flags (after the sources), and on macOS the libomp the library
    must load as @rpath/libomp.dylib, as libtorch_cpu does (torch's copy names its build machine's path)."""

    name: str
    flags: tuple[str, ...] = ()
    libomp: Path | None = None


OWN_OPENMP, NO_OPENMP = OpenMP("-fopenmp", ("-fopenmp",)), OpenMP("no OpenMP")


def openmp_choices() -> list[OpenMP]:
    """The ways to build the kernels, best first: the compiler's own OpenMP (-fopenmp: gcc, Linux clang with
    libomp); the libomp torch ships (its macOS wheels, where Apple's clang takes no -fopenmp; `-Xclang -fopenmp`
    as torch's inductor builds there). On macOS torch's comes first: any clang takes it, and a second libomp
    (Homebrew clang's own) beside torch's aborts the process at the first parallel call. Last, none (one thread
    per kernel call)."""
    lib, include = torch_root() / "lib", torch_root() / "include"
    if not ((include / "omp.h").is_file() and any(lib.glob("libomp.*"))):
        return [OWN_OPENMP, NO_OPENMP]
    darwin = sys.platform == "darwin"
    torchs = OpenMP("torch's libomp", ("-Xclang", "-fopenmp", f"-I{include}", f"-L{lib}", "-lomp",
                                       f"-Wl,-rpath,{lib}"), lib / "libomp.dylib" if darwin else None)
    return [torchs, OWN_OPENMP, NO_OPENMP] if darwin else [OWN_OPENMP, torchs, NO_OPENMP]


def _load_libomp_by_rpath(library: Path, libomp: Path) -> None:
    """Point `library`'s load of `libomp` (by its install name) at @rpath/libomp.dylib: dyld then resolves it
    through the rpath to torch's copy, the one libtorch_cpu already loaded the same way (one OpenMP runtime in
    the process; two abort it). otool, install_name_tool and codesign come with macOS and Xcode's command line
    tools, as clang does."""
    name = subprocess.run(["otool", "-D", str(libomp)], capture_output=True, text=True, check=True,
                          timeout=30).stdout.split()[-1]
    subprocess.run(["install_name_tool", "-change", name, "@rpath/libomp.dylib", str(library)], check=True,
                   capture_output=True, text=True, timeout=30)
    if shutil.which("codesign"):  # the edit voids the linker's ad-hoc signature, which Apple silicon requires
        subprocess.run(["codesign", "--force", "--sign", "-", str(library)], check=True, capture_output=True,
                       text=True, timeout=30)


def torch_root() -> Path:
    return Path(torch.__file__).resolve().parent


@functools.cache
def _version(compiler: str) -> str:
    """`compiler --version` (part of the build's cache key), asked once per compiler, not once per OpenMP choice."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout


def compile_library(compiler: str, target: str, directory: Path, openmp: OpenMP = OWN_OPENMP) -> Path:
    """The kernels compiled by `compiler` for instruction set `target` (a key of ISA_FLAGS) with `openmp` into
    `directory`, once per source, flags and compiler version: the library's path. Raises CalledProcessError where
    it does not build."""
    version = _version(compiler)
    flags = (*FLAGS, *ISA_FLAGS[target])
    source = b"".join(s.read_bytes() for s in SOURCES + HEADERS)
    recipe = " ".join((*flags, *openmp.flags, str(openmp.libomp)))
    key = hashlib.sha256(source + recipe.encode() + version.encode()).hexdigest()[:16]
    path = directory / f"panel_gemm-{target}-{key}.so"
    failed = path.with_suffix(".failed")  # the compiler's errors, kept: a choice that fails is not retried
    if failed.is_file():
        raise subprocess.CalledProcessError(1, compiler, stderr=failed.read_text())
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # build aside, then move: no half-written .so
            built = Path(tmp) / path.name
            try:
                subprocess.run([compiler, *flags, *map(str, SOURCES), *openmp.flags, "-o", str(built)], check=True,
                               capture_output=True, text=True, timeout=300)
                if openmp.libomp is not None:
                    _load_libomp_by_rpath(built, openmp.libomp)
            except subprocess.CalledProcessError as e:
                if e.returncode > 0:  # the compiler said no (not a killed or timed-out run)
                    failed.write_text(e.stderr or "")
                raise
            os.replace(built, path)
    return path


@functools.cache
def build(target: str) -> ctypes.CDLL | None:
    """The kernels built for instruction set `target` (a key of ISA_FLAGS; the CPU must have it) and loaded, or
    None where they do not build: with the first of `openmp_choices()` that builds and loads."""
    missing = [s.name for s in SOURCES + HEADERS if not s.is_file()]
    if missing:
        log.warning("the CPU kernels' %s missing from %s (an incomplete install: reinstall ssd-chat): the few-row "
                    "matmuls stay on MKL", ", ".join(missing), SOURCE.parent)
        return None
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        log.info("no C++ compiler (c++ or $CXX): the few-row matmuls stay on MKL")
        return None
    choices = openmp_choices()
    for i, openmp in enumerate(choices):
        try:
            lib = ctypes.CDLL(str(compile_library(compiler, target, cache_dir(), openmp)))
        except (OSError, subprocess.SubprocessError) as e:
            if i < len(choices) - 1:
                continue
            detail = getattr(e, "stderr", None) or str(e)
            log.warning("the panel kernel did not build (%s): the few-row matmuls stay on MKL",
                        detail.strip().splitlines()[-1] if detail.strip() else type(e).__name__)
            return None
        if openmp is NO_OPENMP:  # torch's threads are not the matmuls' then: worth seeing
            log.warning("the CPU kernels built without OpenMP (%s has none that builds): one thread per kernel call",
                        compiler)
        elif i > 0:
            log.info("the CPU kernels built with %s (%s)", openmp.name, compiler)
        _declare(lib)
        return lib


# causal_attention's (and its half cache's) C parameters: q, n, H, D, K, V, KVH, S, first, t, scale, out, threads
CAUSAL_ATTENTION_ARGS = [ctypes.c_void_p, *[ctypes.c_long] * 3, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_long] * 4,
                         ctypes.c_float, ctypes.c_void_p, ctypes.c_int]


def _declare(lib: ctypes.CDLL) -> None:
    """The kernels' C signatures, for ctypes."""
    lib.panel_gemm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.panel_gemm.restype = None
    lib.panel4_gemm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]  # panel4.py's
    lib.panel4_gemm.restype = None
    lib.panel8_gemm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_long, ctypes.c_int]  # panel8.py's
    lib.panel8_gemm.restype = None
    lib.panel4q8_gemm.argtypes = lib.panel4_gemm.argtypes  # q8_gemm.cpp: panel4_gemm's operands
    lib.panel4q8_gemm.restype = None
    lib.panel8q8_gemm.argtypes = lib.panel8_gemm.argtypes
    lib.panel8q8_gemm.restype = None
    lib.panel8_screened.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, *[ctypes.c_void_p] * 4,
                                    ctypes.c_long, ctypes.c_int]  # panel8.py's, plus its bound_sums
    lib.panel8_screened.restype = ctypes.c_long
    lib.q8_screen8.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, *[ctypes.c_void_p] * 6, ctypes.c_long,
                               ctypes.c_int]  # panel8_screened's bounds (tests)
    lib.q8_screen8.restype = None
    lib.q8_support.argtypes, lib.q8_support.restype = [], ctypes.c_int
    lib.q8_path.argtypes, lib.q8_path.restype = [ctypes.c_int], ctypes.c_int
    lib.low_bit_rebuild_rows.argtypes, lib.low_bit_rebuild_rows.restype = [ctypes.c_long], ctypes.c_long
    lib.fp32_tall_rows.argtypes, lib.fp32_tall_rows.restype = [ctypes.c_long], ctypes.c_long
    lib.sampling_probs.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_long, ctypes.c_float,
                                   ctypes.c_void_p]  # engine/sampling.py's
    lib.sampling_probs.restype = ctypes.c_int
    lib.sampling_inverse_cdf.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_double]
    lib.sampling_inverse_cdf.restype = ctypes.c_long
    lib.sampling_race.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_long,
                                  ctypes.c_long, ctypes.c_void_p]
    lib.sampling_race.restype = ctypes.c_long  # engine/coupling.py's
    lib.rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_float,
                             ctypes.c_void_p]  # norm.py's
    lib.rms_norm.restype = None
    for name in ("causal_attention", "causal_attention_half"):  # sdpa.py's
        getattr(lib, name).argtypes, getattr(lib, name).restype = CAUSAL_ATTENTION_ARGS, None
    lib.causal_attention_spans.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 2, ctypes.c_void_p, ctypes.c_void_p,
                                           *[ctypes.c_long] * 3, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                                           ctypes.c_void_p, ctypes.c_int]  # sdpa.py's
    lib.causal_attention_spans.restype = None
    lib.causal_attention_spans_half.argtypes = lib.causal_attention_spans.argtypes
    lib.causal_attention_spans_half.restype = None
    lib.layer_front.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                *[ctypes.c_long] * 4, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_long] * 4,
                                ctypes.c_float, ctypes.c_void_p, ctypes.c_int]  # fused.py's
    lib.layer_front.restype = ctypes.c_int
    lib.decoder_layers.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 2, *[ctypes.c_void_p] * 3,
                                   *[ctypes.c_long] * 4, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_long] * 4,
                                   ctypes.c_float, ctypes.c_int]  # fused.py's
    lib.decoder_layers.restype = ctypes.c_int
    lib.silu_mul.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
    lib.silu_mul.restype = None
    lib.rotary_rows.argtypes = [ctypes.c_void_p, *[ctypes.c_long] * 4, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_long]  # tests/engine/test_fused.py's
    lib.rotary_rows.restype = None
