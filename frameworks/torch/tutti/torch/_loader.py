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


def preload_tutti(extension_path):
    """Opens the libtutti the extension at `extension_path` links, with RTLD_DEEPBIND.
    Does nothing where that flag does not exist (not glibc) or libtutti is not found there
    (the dynamic loader then finds it as usual)."""
    deepbind = getattr(os, "RTLD_DEEPBIND", 0)
    if not deepbind:
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
