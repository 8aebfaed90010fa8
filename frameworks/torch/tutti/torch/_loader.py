"""Loads libtutti so that it keeps its own gloo when torch brings another one.

PyTorch's wheels (2.x) export the symbols of the gloo copy built into libtorch_cpu, and torch
is loaded first: libtutti's calls into the system's libgloo (a different gloo snapshot, with
a different object layout) would bind to torch's copy and crash in the first collective.
Opening libtutti (and with it libgloo) with RTLD_DEEPBIND before the extension makes both
resolve gloo within themselves first. libtutti is found through the extension's RUNPATH,
read from its ELF dynamic section.
"""

import ctypes
import os
import struct

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29


def _runpath_and_needed(path):
    """(search directories, NEEDED names) of a 64-bit little-endian ELF shared object."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x7fELF\x02\x01":
        return [], []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return [], []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + off)
               for off in range(0, dynamic[1], 16)]
    strtab = next((value for tag, value in entries if tag == _DT_STRTAB), None)
    base = next((off + strtab - vaddr for vaddr, off, size in loads
                 if strtab is not None and vaddr <= strtab < vaddr + size), None)
    if base is None:
        return [], []

    def string(offset):
        end = data.index(b"\0", base + offset)
        return data[base + offset:end].decode()

    origin = os.path.dirname(os.path.abspath(path))
    dirs = [d.replace("$ORIGIN", origin) for tag, value in entries
            if tag in (_DT_RUNPATH, _DT_RPATH) for d in string(value).split(":") if d]
    needed = [string(value) for tag, value in entries if tag == _DT_NEEDED]
    return dirs, needed


# A gloo function every gloo build exports; where the process resolves it tells whose gloo
# wins the global symbol lookup.
_GLOO_PROBE = "_ZN4gloo7Context19createUnboundBufferEPvm"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _torch_brings_gloo():
    """True when torch's libtorch_cpu resolves gloo symbols to a library that is not a
    libgloo (torch wheels build gloo into libtorch_cpu); False for Debian's torch, which
    links the system libgloo like libtutti does."""
    import torch
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if not os.path.exists(library):
        return False  # a distribution's torch, with its libraries elsewhere
    try:
        torch_cpu = ctypes.CDLL(library)  # already loaded: the same handle
        address = ctypes.cast(getattr(torch_cpu, _GLOO_PROBE), ctypes.c_void_p).value
        info = _DlInfo()
        if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
            return False
    except (AttributeError, OSError):
        return False  # no gloo in this torch, or no dladdr: nothing to protect against
    return b"libgloo" not in os.path.basename(info.dli_fname or b"")


def preload_tutti(extension_path):
    """Opens the libtutti the extension at `extension_path` links, with RTLD_DEEPBIND, when
    torch brings its own gloo. Does nothing otherwise, where that flag does not exist (not
    glibc), or when libtutti is not found there (the dynamic loader then finds it as usual).

    RTLD_DEEPBIND also binds libtutti's `environ` to libc's own copy, which an interpreter
    executable with a copy relocation of `environ` leaves empty (Debian's /usr/bin/python3):
    there Tutti would not see its TUTTI_* variables. Hence the preload only where needed
    (PyTorch wheels, normally installed in a virtual environment of a python.org or pyenv
    interpreter, which links libpython dynamically and has no such copy)."""
    deepbind = getattr(os, "RTLD_DEEPBIND", 0)
    if not deepbind or not _torch_brings_gloo():
        return
    try:
        dirs, needed = _runpath_and_needed(extension_path)
    except (OSError, ValueError, struct.error):
        return
    for name in (n for n in needed if n.startswith("libtutti.")):
        for directory in dirs:
            candidate = os.path.join(directory, name)
            if os.path.exists(candidate):
                ctypes.CDLL(candidate, mode=os.RTLD_NOW | os.RTLD_GLOBAL | deepbind)
                return
