"""libtutti exports the C API and nothing else.

Reads the functions tutti.h declares (tutti_*), lists the symbols the shared library defines
(`nm -D --defined-only`) and fails when

  - a symbol is exported that tutti.h does not declare: any C++ symbol (the C++ API of
    tutti.hpp is header-only over the C API, so that nothing with std:: types crosses the
    library boundary), an internal helper, a template instantiation of the standard library;
  - a function tutti.h declares is not exported (hidden by mistake).

Usage: exports_test.py LIBTUTTI INCLUDE_DIR
"""
import re
import subprocess
import sys

# Defined by the linker in every shared object.
LINKER_SYMBOLS = {"_init", "_fini", "__bss_start", "_edata", "_end"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def public_names(include_dir):
    c_header = strip_comments(open(include_dir + "/tutti.h").read())
    # Declarations, not the function-pointer fields of structs ("(*allocator)(").
    return set(re.findall(r"\b(tutti_[a-z0-9_]+)\s*\(", c_header))


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library],
                         check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols.append(parts[2].split("@", 1)[0])
    return symbols


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    library, include_dir = sys.argv[1], sys.argv[2]
    c_names = public_names(include_dir)
    if len(c_names) < 10:
        sys.exit(f"found {len(c_names)} declarations in {include_dir}/tutti.h: "
                 "the header parser no longer matches the header")
    leaked, seen = [], set()
    for symbol in exported(library):
        if symbol in LINKER_SYMBOLS:
            continue
        if symbol in c_names:
            seen.add(symbol)
            continue
        leaked.append(symbol)
    missing = sorted(c_names - seen)
    ok = True
    if leaked:
        ok = False
        cxx = sum(1 for s in leaked if s.startswith("_Z"))
        print(f"{library} exports {len(leaked)} symbol(s) that tutti.h does not declare, "
              f"{cxx} of them C++ (expected the C API of include/tutti/tutti.h only; "
              "hide them, and keep tutti.hpp header-only):")
        for symbol in leaked[:40]:
            print("  " + symbol)
        if len(leaked) > 40:
            print(f"  ... and {len(leaked) - 40} more")
    if missing:
        ok = False
        print(f"{library} does not export {len(missing)} function(s) that tutti.h declares "
              "(expected every one; is the header inside its visibility push?):")
        for name in missing:
            print("  " + name)
    if ok:
        print(f"{library}: exports {len(seen)} C functions (tutti_*) and nothing else")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
