"""The CPU kernels built for AArch64 (NEON) by a cross compiler and run under qemu-user, so that an x86 machine
checks the NEON build's bits against its own builds (tests/engine/test_isa.py). Needs Debian's
``g++-aarch64-linux-gnu`` and ``qemu-user`` (``apt-get install g++-aarch64-linux-gnu qemu-user``, and ``clang``
for the build without OpenMP); without them `library()` is None and those tests skip. qemu runs AArch64's float32
arithmetic (FMAs, roundings) exactly, not at its speed: these are checks of bits, not timings.

`call(lib, name, *args)` calls a kernel on a ctypes library (tensors as their data pointers) or on a `Library`
here (tensors as their bytes, copied back after the call), so one test runs on every build.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import io
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

from engine.layers import native

CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # the cross toolchain's libraries (libc, libstdc++, libgomp)
DRIVER = Path(__file__).with_name("kernel_driver.cpp")


class Struct:
    """A C struct argument of longs (Python ints), floats and pointers (tensors, or None for NULL), in declaration
    order, laid out as LP64 C compilers lay it out on x86-64 and AArch64 alike (8-byte longs and pointers, 4-byte
    floats, each aligned to its size)."""

    def __init__(self, *fields: int | float | torch.Tensor | None) -> None:
        self.fields = fields

    def _offsets(self) -> tuple[list[int], int]:
        offsets, size = [], 0
        for f in self.fields:
            width = 4 if isinstance(f, float) else 8
            size += -size % width
            offsets.append(size)
            size += width
        return offsets, size + -size % 8

    def pack(self, address) -> bytes:
        """The struct's bytes, each pointer field address(tensor) (0 for None)."""
        offsets, size = self._offsets()
        out = bytearray(size)
        for offset, f in zip(offsets, self.fields, strict=True):
            if isinstance(f, float):
                struct.pack_into("<f", out, offset, f)
            else:
                struct.pack_into("<q", out, offset, f if isinstance(f, int) else 0 if f is None else address(f))
        return bytes(out)

    def pointers(self) -> list[tuple[int, torch.Tensor]]:
        """(byte offset, tensor) of each non-NULL pointer field."""
        offsets, _ = self._offsets()
        return [(o, f) for o, f in zip(offsets, self.fields, strict=True) if isinstance(f, torch.Tensor)]


class Library:
    """A NEON build of the kernels, called through kernel_driver.cpp under qemu (one process per call)."""

    def __init__(self, path: Path, driver: Path) -> None:
        self.path, self.driver = path, driver

    def call(self, name: str, *args: object) -> None:
        """name(*args): tensors (contiguous, on the CPU) are passed as buffers and get the buffers' bytes back;
        Python ints are the kernel's long or int parameters, floats its float ones."""
        structs = [a for a in args if isinstance(a, Struct)]
        hidden = [t for st in structs for _, t in st.pointers()]  # the structs' tensors: buffers after the args
        calls = io.BytesIO()
        calls.write(struct.pack("<q", len(name)) + name.encode() + struct.pack("<q", len(args) + len(hidden)))
        tensors = []
        index = len(args)  # the hidden buffers' argument indices
        for a in (*args, *hidden):
            if isinstance(a, Struct):  # its bytes, then (offset, argument index) of each pointer to patch
                data, links = a.pack(lambda t: 0), a.pointers()
                calls.write(b"s" + struct.pack("<q", len(data)) + data + struct.pack("<q", len(links)))
                for offset, _ in links:
                    calls.write(struct.pack("<qq", offset, index))
                    index += 1
            elif isinstance(a, torch.Tensor):
                assert a.is_contiguous() and a.device.type == "cpu", "kernel buffers are contiguous CPU tensors"
                data = a.view(torch.uint8).reshape(-1).numpy().tobytes()
                calls.write(b"b" + struct.pack("<q", len(data)) + data)
                tensors.append(a)
            elif isinstance(a, int):
                calls.write(b"n" + struct.pack("<q", a))
            elif isinstance(a, float):
                calls.write(b"d" + struct.pack("<d", a))
            else:
                raise TypeError(f"no kernel argument of type {type(a).__name__}")
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "calls").write_bytes(calls.getvalue())
            subprocess.run([QEMU, "-L", str(SYSROOT), str(self.driver), str(self.path), f"{tmp}/calls",
                            f"{tmp}/out"], check=True, capture_output=True, timeout=300)
            out = Path(tmp, "out").read_bytes()
        offset = 0
        for t in tensors:
            size = t.numel() * t.element_size()
            t.view(torch.uint8).reshape(-1).copy_(torch.frombuffer(bytearray(out[offset : offset + size]),
                                                                  dtype=torch.uint8))
            offset += size
        assert offset == len(out), (offset, len(out))


def _once(path: Path, make) -> Path:
    """path, made by make(scratch_path) aside and moved into place (parallel test workers) where it is missing."""
    if not path.is_file():
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            make(Path(tmp) / "made")
            os.replace(Path(tmp) / "made", path)
    return path


@functools.cache
def library(compiler: str = CXX) -> Library | None:
    """The kernels built for NEON and the driver, or None without the cross tools. `compiler`: the cross g++
    (with OpenMP), or "clang++" (targeting AArch64, without OpenMP: the build Apple's clang makes)."""
    if any(shutil.which(tool) is None for tool in (CXX, QEMU, compiler)) or not SYSROOT.is_dir():
        return None
    directory = native.cache_dir() / "aarch64"
    directory.mkdir(parents=True, exist_ok=True)
    if compiler == CXX:
        path = native.compile_library(shutil.which(CXX), "neon", directory)
    else:  # a wrapper names the target: compile_library takes a compiler, not flags
        script = f'#!/bin/sh\nexec {shutil.which(compiler)} --target=aarch64-linux-gnu "$@"\n'
        wrapper = _once(directory / f"{compiler}-aarch64", lambda p: (p.write_text(script), p.chmod(0o755)))
        path = native.compile_library(str(wrapper), "neon", directory, native.NO_OPENMP)
    driver = directory / f"kernel_driver-{hashlib.sha256(DRIVER.read_bytes()).hexdigest()[:16]}"
    _once(driver, lambda p: subprocess.run([CXX, "-O1", "-std=c++17", str(DRIVER), "-o", str(p), "-ldl"],
                                           check=True, capture_output=True, timeout=300))
    return Library(path, driver)


def call(lib: ctypes.CDLL | Library, name: str, *args: object) -> object:
    """lib.name(*args) on either kind of library: tensors as data pointers (ctypes) or buffers (`Library`), a
    `Struct` as a pointer to its bytes. The ctypes call's result, or None (`Library`: layer_front's is checked
    there)."""
    if isinstance(lib, Library):
        lib.call(name, *args)
        return
    keep = []  # the structs' buffers, alive through the call

    def as_c(a: object) -> object:
        if isinstance(a, torch.Tensor):
            return a.data_ptr()
        if isinstance(a, Struct):
            keep.append(ctypes.create_string_buffer(a.pack(lambda t: t.data_ptr())))
            return ctypes.addressof(keep[-1])
        return a

    return getattr(lib, name)(*map(as_c, args))
