"""libtutti exports its public API and nothing else.

Reads the names the public headers declare (tutti_* functions in tutti.h, the free functions
and types of namespace tutti in tutti.hpp), lists the symbols the shared library defines
(`nm -D --defined-only`, demangled) and fails when

  - a symbol is exported that no public header declares (an internal class, a helper in
    namespace tutti, a template instantiation from the standard library), or
  - a function a public header declares is not exported (hidden by mistake).

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
    c_names = set(re.findall(r"\b(tutti_[a-z0-9_]+)\s*\(", c_header))
    cpp_header = strip_comments(open(include_dir + "/tutti.hpp").read())
    # Declarations at the top level of the namespace start in column 0.
    cpp_functions = set()
    for line in cpp_header.splitlines():
        m = re.match(r"^[A-Za-z].*?\b([a-z][A-Za-z0-9_]*)\(", line)
        if m and not line.startswith(("namespace", "using", "typedef")):
            cpp_functions.add(m.group(1))
    cpp_types = set(re.findall(r"^(?:struct|class|enum class)\s+([A-Za-z0-9_]+)", cpp_header,
                               flags=re.M))
    return c_names, cpp_functions, cpp_types


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", "--demangle", library],
                         check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            symbols.append(parts[2])
    return symbols


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    library, include_dir = sys.argv[1], sys.argv[2]
    c_names, cpp_functions, cpp_types = public_names(include_dir)
    if not c_names or not cpp_functions:
        sys.exit(f"found no declarations in {include_dir}/tutti.h or tutti.hpp: "
                 "the header parser no longer matches the headers")
    leaked, seen = [], set()
    for symbol in exported(library):
        name = re.sub(r"\[abi:[^\]]*\]", "", symbol).split("(", 1)[0].split("@", 1)[0]
        if name in LINKER_SYMBOLS:
            continue
        if name in c_names:
            seen.add(name)
            continue
        m = re.fullmatch(r"tutti::([A-Za-z0-9_]+)", name)
        if m and m.group(1) in cpp_functions:
            seen.add(name)
            continue
        m = re.match(r"tutti::([A-Za-z0-9_]+)::", name)
        if m and m.group(1) in cpp_types:
            continue
        leaked.append(symbol)
    missing = sorted((c_names | {"tutti::" + f for f in cpp_functions}) - seen)
    ok = True
    if leaked:
        ok = False
        print(f"{library} exports {len(leaked)} symbol(s) that no public header declares "
              "(expected only the API of core/include/tutti/; hide them):")
        for symbol in leaked[:40]:
            print("  " + symbol)
        if len(leaked) > 40:
            print(f"  ... and {len(leaked) - 40} more")
    if missing:
        ok = False
        print(f"{library} does not export {len(missing)} function(s) that the public headers "
              "declare (expected every one; is the header inside its visibility push?):")
        for name in missing:
            print("  " + name)
    if ok:
        print(f"{library}: exports {len(seen)} public functions and nothing else")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
