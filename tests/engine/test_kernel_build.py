"""How the CPU kernels are chosen and built: the instruction set the CPU has ($SSD_CHAT_CPU_ISA another one only
where the CPU has it; NEON on AArch64), and OpenMP where the compiler has it, else torch's libomp (macOS: before the
compiler's own), else none, each giving the same bits."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import torch

from engine import cpu_info
from engine.layers import native, panel
from tests.engine.cross import call
from tests.engine.test_isa import _equal, _x86_isas


@pytest.mark.skipif(len(_x86_isas()) < 2, reason="needs a CPU with AVX-512 and AVX2")
def test_the_cpu_decides_which_build_loads(monkeypatch, caplog):
    try:
        monkeypatch.delenv(native.ISA_ENV, raising=False)
        native.forget()
        assert native.isa() == "avx512"
        monkeypatch.setenv(native.ISA_ENV, "avx2")
        native.forget()
        assert native.isa() == "avx2"
        monkeypatch.setattr(cpu_info, "flags", lambda: frozenset({"avx2", "fma", "f16c", "sse4_2"}))  # an AVX2-only CPU
        monkeypatch.setenv(native.ISA_ENV, "avx512")
        native.forget()
        with caplog.at_level(logging.WARNING, logger="engine.layers.native"):
            assert native.isa() == "avx2"
        assert "SSD_CHAT_CPU_ISA=avx512" in caplog.text
        monkeypatch.setattr(cpu_info, "flags", lambda: frozenset({"sse4_2", "avx"}))  # neither: MKL / oneDNN
        monkeypatch.delenv(native.ISA_ENV)
        native.forget()
        assert native.isa() is None and not panel.available()
    finally:
        monkeypatch.undo()
        native.forget()


def test_aarch64_takes_the_neon_build(monkeypatch, caplog):
    try:
        monkeypatch.setattr(platform, "machine", lambda: "arm64")  # Apple silicon; Linux says aarch64
        monkeypatch.delenv(native.ISA_ENV, raising=False)
        native.forget()
        assert native.isa() == "neon"
        monkeypatch.setenv(native.ISA_ENV, "avx2")
        native.forget()
        with caplog.at_level(logging.WARNING, logger="engine.layers.native"):
            assert native.isa() == "neon"
        assert "SSD_CHAT_CPU_ISA=avx2: this CPU runs neon" in caplog.text
        monkeypatch.setenv(native.ISA_ENV, "none")
        native.forget()
        assert native.isa() is None
    finally:
        monkeypatch.undo()
        native.forget()


@pytest.mark.skipif(not _x86_isas(), reason="builds the kernels for this x86 CPU")
def test_a_compiler_without_openmp_builds_single_threaded_kernels(tmp_path, monkeypatch, caplog):
    """As Apple's clang, which refuses -fopenmp: the kernels build without it and give the same bits, on one
    thread whatever the thread count asked."""
    compiler = tmp_path / "no-openmp-c++"
    compiler.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo -fopenmp >> {tmp_path}/asked; '
                        'echo "error: unsupported option -fopenmp" >&2; exit 1; }; done\nexec c++ "$@"\n')
    compiler.chmod(0o755)
    reference = native.build(_x86_isas()[0])
    if reference is None:
        pytest.skip("the kernels do not build here (no C++ compiler)")
    try:
        lib, linked = _build_with(compiler, tmp_path / "kernels", monkeypatch, caplog)
        assert "without OpenMP" in caplog.text
        assert "libgomp" not in linked and "libomp" not in linked  # no OpenMP runtime
        assert len(list((tmp_path / "kernels").glob("panel_gemm-*.failed"))) == 1  # -fopenmp's refusal, kept
        native.forget()
        assert native.build(_x86_isas()[0]) is not None
        assert (tmp_path / "asked").read_text().count("-fopenmp") == 1  # not asked again
        assert _same_gemm_bits(reference, lib)
    finally:
        monkeypatch.undo()
        native.forget()


# LLVM's OpenMP runtime (Debian's libomp-dev), as torch's macOS wheel ships it
LLVM_OMP = max(Path("/usr/lib").glob("llvm-*/lib"), default=Path("/usr/lib/llvm/lib"))


@pytest.mark.skipif(not _x86_isas() or shutil.which("clang++") is None or not (LLVM_OMP / "libomp.so").exists(),
                    reason="needs clang++ and LLVM's libomp (apt-get install clang libomp-dev)")
def test_a_compiler_without_openmp_takes_the_libomp_torch_ships(tmp_path, monkeypatch, caplog):
    """As on macOS: Apple's clang refuses -fopenmp, torch's wheel ships omp.h and libomp; the kernels build with
    `-Xclang -fopenmp` against them, run multi-threaded with that runtime, and give the same bits."""
    root = tmp_path / "torch"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy(next(LLVM_OMP.glob("clang/*/include/omp.h")), root / "include")
    for name in ("libomp.so", "libomp.so.5"):  # the link name and the runtime's soname
        shutil.copy(LLVM_OMP / "libomp.so", root / "lib" / name)
    compiler = tmp_path / "apple-like-clang++"
    compiler.write_text('#!/bin/sh\nprev=\nfor a in "$@"; do\n  if [ "$a" = -fopenmp ] && [ "$prev" != -Xclang ]; '
                        'then echo "error: unsupported option -fopenmp" >&2; exit 1; fi\n  prev=$a\ndone\n'
                        f'exec {shutil.which("clang++")} "$@"\n')
    compiler.chmod(0o755)
    reference = native.build(_x86_isas()[0])
    try:
        monkeypatch.setattr(native, "torch_root", lambda: root)
        lib, linked = _build_with(compiler, tmp_path / "kernels", monkeypatch, caplog)
        assert "torch's libomp" in caplog.text
        assert str(root / "lib" / "libomp.so.5") in linked  # found through the rpath: torch's copy, not the system's
        assert _same_gemm_bits(reference, lib)
    finally:
        monkeypatch.undo()
        native.forget()


def _build_with(compiler: Path, cache: Path, monkeypatch, caplog) -> tuple[object, str]:
    """The kernels for this CPU built afresh by `compiler` into `cache`, and what the library links (ldd)."""
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("SSD_CHAT_KERNEL_CACHE", str(cache))
    native.forget()
    with caplog.at_level(logging.INFO, logger="engine.layers.native"):
        lib = native.build(_x86_isas()[0])
    assert lib is not None
    (built,) = cache.glob("panel_gemm-*.so")
    return lib, subprocess.run(["ldd", str(built)], capture_output=True, text=True).stdout


def _same_gemm_bits(reference, lib) -> bool:
    """Whether a 5-row float32 panel GEMM on two threads gives the same bits on both libraries."""
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(5, 64, generator=g), torch.randn(256, 64, generator=g)
    outputs = []
    for kernels in (reference, lib):
        y = torch.empty(5, 256)
        call(kernels, "panel_gemm", x, 5, 64, panel.to_panels(w), y, 256, 2)
        outputs.append(y)
    return _equal(outputs)


@pytest.mark.parametrize("system", ["darwin", "linux"])
def test_torchs_libomp_comes_first_on_macos_only(system, tmp_path, monkeypatch):
    """Where torch ships omp.h and libomp (its macOS wheels): first on macOS (a compiler's own libomp beside
    torch's would abort the process), with the dylib to re-point to @rpath; after -fopenmp elsewhere."""
    (tmp_path / "include").mkdir()
    (tmp_path / "lib").mkdir()
    monkeypatch.setattr(native, "torch_root", lambda: tmp_path)
    monkeypatch.setattr(native.sys, "platform", system)
    assert native.openmp_choices() == [native.OWN_OPENMP, native.NO_OPENMP]  # a torch without libomp (Linux wheels)
    (tmp_path / "include" / "omp.h").write_text("")
    (tmp_path / "lib" / "libomp.dylib").write_text("")
    choices = native.openmp_choices()
    torchs = next(c for c in choices if c.name == "torch's libomp")
    assert "-lomp" in torchs.flags and f"-Wl,-rpath,{tmp_path / 'lib'}" in torchs.flags
    if system == "darwin":
        assert choices == [torchs, native.OWN_OPENMP, native.NO_OPENMP]
        assert torchs.libomp == tmp_path / "lib" / "libomp.dylib"
    else:
        assert choices == [native.OWN_OPENMP, torchs, native.NO_OPENMP] and torchs.libomp is None


def test_an_installed_package_carries_every_kernel_source_and_header():
    # A wheel (`pip install .`, not -e) holds engine's package data only: the headers were left out until
    # 2026-12-08, and without them the kernels did not build (every few-row matmul then on MKL).
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["engine"]
    package = Path(native.__file__).resolve().parent.parent
    for path in native.SOURCES + native.HEADERS:
        assert any(path.relative_to(package).match(glob) for glob in globs), path.name


def test_a_missing_kernel_file_says_so_and_builds_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(native, "HEADERS", (*native.HEADERS, tmp_path / "gone.h"))
    native.build.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=native.__name__):
            assert native.build(native.isa() or "avx2") is None
    finally:
        native.build.cache_clear()
    assert "gone.h missing" in caplog.text and "reinstall ssd-chat" in caplog.text
