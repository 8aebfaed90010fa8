"""What README.md and docs/ show runs as shown: one spelling of the version everywhere it is
written, the `tuttirun --mpi --dry-run` and `--check-build` output as docs/launcher.md shows
it, every `tuttirun` command in a code block accepted as written,
scripts/horovod_compat.py's documented commands, README's C quick start, and no internal
issue numbers in the docs or the sources' messages."""
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import tempfile
import unittest

from launcher_test_util import LIB_DIR, run

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
COMPAT = os.path.join(ROOT, "scripts", "horovod_compat.py")


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def code_lines(path):
    """(line number, text) of every line inside a fenced code block, continuations joined."""
    lines, inside, pending = [], False, None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                inside, pending = not inside, None
                continue
            if not inside:
                continue
            text = line.rstrip("\n")
            if pending:
                lines[-1] = (lines[-1][0], lines[-1][1] + " " + text.strip().rstrip("\\"))
            else:
                lines.append((number, text.rstrip("\\")))
            pending = text.endswith("\\")
    return lines


def project_version():
    return re.search(r"project\(Tutti VERSION ([0-9.]+)", read("CMakeLists.txt")).group(1)


def clean_env():
    """An environment of PATH and LANG only, as the documented outputs assume."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def documented_output(doc, command_prefix):
    """The `$ command` line starting with command_prefix in doc and the lines after it up
    to the end of its code block."""
    with open(os.path.join(ROOT, "docs", doc)) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if line.startswith("$ " + command_prefix):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            return line[2:], lines[i + 1:end]
    raise AssertionError("docs/%s shows no `$ %s` example" % (doc, command_prefix))


# Where users read text: the docs, and every source directory's messages and comments.
MESSAGE_DIRS = ["base", "core", "backends", "frameworks", "launcher", "bench", "include",
                "scripts", "cmake", "examples"]
# Being rewritten on other branches right now (the horovodrun flag table, the PyTorch
# differences list); to be dropped once those are merged.
PENDING = set()
INTERNAL_ISSUE = re.compile(r"(?<!Horovod )\b[Ii]ssue \d+|(?<![\w&/])#\d+\b")


class IssueNumberTest(unittest.TestCase):
    def test_no_internal_issue_numbers(self):
        paths = list(DOCS) + [os.path.join(ROOT, name)
                              for name in ("CMakeLists.txt", "pyproject.toml")]
        for top in MESSAGE_DIRS:
            for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                paths += [os.path.join(folder, f) for f in files
                          if f.endswith((".h", ".hpp", ".cc", ".c", ".py", ".sh", ".cmake",
                                         ".txt", ".md", ".in", ".map"))
                          or f in ("tuttirun", "tutti-timeline")]
        self.assertGreater(len(paths), 100)
        found = []
        for path in paths:
            rel = os.path.relpath(path, ROOT)
            if rel in PENDING:
                continue
            with open(path, errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if INTERNAL_ISSUE.search(line):
                        found.append("%s:%d: %s" % (rel, number, line.strip()))
        self.assertEqual(found, [], "internal issue numbers:\n" + "\n".join(found))


class VersionTest(unittest.TestCase):
    def test_one_version_everywhere(self):
        version = project_version()
        self.assertRegex(version, r"^\d+\.\d+\.\d+$")
        major, minor, _ = version.split(".")
        header = read("include/tutti/tutti.h")
        self.assertIn("#define TUTTI_VERSION_MAJOR %s\n" % major, header)
        self.assertIn("#define TUTTI_VERSION_MINOR %s\n" % minor, header)
        init = read("frameworks/torch/tutti/__init__.py")
        self.assertEqual(re.search(r'__version__ = "([^"]*)"', init).group(1), version,
                         "frameworks/torch/tutti/__init__.py against CMakeLists.txt")
        # pyproject.toml reads it out of CMakeLists.txt with its own regex.
        regex = re.search(r"regex = '([^']*)'", read("pyproject.toml")).group(1)
        self.assertEqual(re.search(regex, read("CMakeLists.txt")).group("value"), version)
        # Every versioned name the docs show: the sdist, --check-build, the library file.
        pattern = re.compile(r"(?:tutti-|Tutti v|libtutti\.so\.)(\d+\.\d+(?:\.\d+)?)")
        for path in DOCS:
            with open(path) as f:
                for number, line in enumerate(f, 1):
                    for found in pattern.findall(line):
                        self.assertEqual(found, version, "%s:%d: %s" % (
                            os.path.relpath(path, ROOT), number, line.strip()))

    def test_built_programs_say_the_same_version(self):
        version = project_version()
        info_path = os.path.join(LIB_DIR, "tuttirun_lib", "build_info.json")
        if not os.path.exists(info_path):
            self.skipTest("tuttirun is not a build tree's copy")
        with open(info_path) as f:
            self.assertEqual(json.load(f)["version"], version)
        r = run(["--version"], timeout=30)
        self.assertEqual(r.stdout.strip(), "tuttirun (Tutti) %s" % version, r.stderr)
        tutti_info = os.environ.get("TUTTI_INFO")
        if tutti_info:
            r = subprocess.run([tutti_info], capture_output=True, text=True, timeout=30,
                               env=clean_env())
            self.assertEqual(r.stdout.split("\n")[0], "Tutti %s" % version, r.stderr)


class DocumentedOutputTest(unittest.TestCase):
    def test_mpi_dry_run_prints_what_launcher_md_shows(self):
        command, shown = documented_output("launcher.md", "tuttirun --mpi --dry-run")
        argv = shlex.split(command)[1:]
        r = run(argv, timeout=30, env=clean_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        got = shlex.split(r.stdout.strip())
        # Run by root, mpirun needs --allow-run-as-root; the docs show another user's run.
        if os.geteuid() == 0:
            self.assertIn("--allow-run-as-root", got)
            got.remove("--allow-run-as-root")
        self.assertEqual(len(shown), 1, shown)
        self.assertEqual(got, shlex.split(shown[0]),
                         "\ndocs: %s\ngot:  %s" % (shown[0], " ".join(got)))

    def test_check_build_prints_what_launcher_md_shows(self):
        _, shown = documented_output("launcher.md", "tuttirun --check-build")
        r = run(["--check-build"], timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = r.stdout.rstrip("\n").split("\n")
        version = project_version()
        self.assertRegex(shown[0], r"^Tutti v%s \(from \S+libtutti\.so\.%s\):$" % (
            re.escape(version), re.escape(version)))
        if os.path.exists(os.path.join(LIB_DIR, "tuttirun_lib", "build_info.json")):
            self.assertRegex(got[0], r"^Tutti v%s \(from \S+libtutti\.so\.%s\):$" % (
                re.escape(version), re.escape(version)))
        # The same lines below it; which boxes are ticked depends on the build.
        unticked = [re.sub(r"\[[X ]\]", "[?]", line) for line in shown[1:]]
        self.assertEqual([re.sub(r"\[[X ]\]", "[?]", line) for line in got[1:]], unticked)


class QuickStartTest(unittest.TestCase):
    def test_readme_c_quick_start_builds_and_runs(self):
        library, compiler = os.environ.get("TUTTI_LIBRARY"), os.environ.get("TUTTI_CC")
        if not library or not compiler:
            self.skipTest("TUTTI_LIBRARY and TUTTI_CC come from CTest")
        with open(os.path.join(ROOT, "README.md")) as f:
            block = f.read().split("```c\n", 1)[1].split("```", 1)[0]
        includes = [line for line in block.split("\n") if line.startswith("#include")]
        body = [line for line in block.split("\n") if not line.startswith("#include")]
        program = "\n".join(["#include <stdio.h>"] + includes +
                             ["int main(void) {"] + body + ["return 0;", "}"]) + "\n"
        with tempfile.TemporaryDirectory() as work:
            source, binary = os.path.join(work, "quick.c"), os.path.join(work, "quick")
            with open(source, "w") as f:
                f.write(program)
            lib_dir = os.path.dirname(library)
            r = subprocess.run([compiler, "-I", os.path.join(ROOT, "include"), source, "-o",
                                binary, "-L", lib_dir, "-ltutti", "-Wl,-rpath," + lib_dir],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, program + r.stderr)
            # One process, no launcher: a job of one rank.
            r = subprocess.run([binary], capture_output=True, text=True, timeout=60,
                               env=clean_env())
            self.assertEqual((r.returncode, r.stderr), (0, ""), program)


class DocumentedCommandsTest(unittest.TestCase):
    def documented(self, program):
        """(where, argv after the program) of every line of a code block that runs it."""
        found = []
        for path in DOCS:
            for number, text in code_lines(path):
                text = text.strip()
                if text.startswith("$ "):
                    text = text[2:]
                if not text.startswith(program + " "):
                    continue
                text = text.split(" # ")[0].split(" #")[0].rstrip()
                where = "%s:%d: %s" % (os.path.relpath(path, ROOT), number, text)
                if "$(" in text or "..." in text or "[" in text:
                    continue  # a template (shell substitution, placeholders), not a command
                found.append((where, shlex.split(text)[1:]))
        return found

    def test_every_tuttirun_command_is_accepted(self):
        commands = self.documented("tuttirun")
        self.assertGreater(len(commands), 10, "fewer documented tuttirun commands than expected")
        with tempfile.TemporaryDirectory() as work:
            # The files the examples name.
            with open(os.path.join(work, "hosts.txt"), "w") as f:
                f.write("localhost slots=16\n")
            with open(os.path.join(work, "discover.sh"), "w") as f:
                f.write("#!/bin/sh\necho localhost:4\n")
            os.chmod(os.path.join(work, "discover.sh"), 0o755)
            for where, argv in commands:
                with self.subTest(where):
                    if "--dry-run" not in argv and "--check-build" not in argv:
                        argv = ["--dry-run"] + argv
                    r = run(argv, timeout=30, cwd=work, env=clean_env())
                    # Example host names (node1, tutti-h1) do not resolve here: that is the
                    # one refusal that says nothing about the command.
                    if r.returncode != 0:
                        self.assertIn("cannot resolve its name", r.stderr, where)
                    self.assertNotIn("usage:", r.stderr, where)
                    self.assertNotIn("unrecognized arguments", r.stderr, where)

    def test_horovod_compat_commands_parse(self):
        self.assertTrue(os.access(COMPAT, os.X_OK), "scripts/horovod_compat.py: not executable")
        commands = self.documented("scripts/horovod_compat.py")
        with open(COMPAT) as f:
            for number, line in enumerate(f, 1):
                if line.startswith("    scripts/horovod_compat.py "):
                    commands.append(("scripts/horovod_compat.py:%d" % number,
                                     shlex.split(line)[1:]))
        self.assertGreaterEqual(len(commands), 4, commands)
        # The script's own parser (importing it runs nothing).
        spec = importlib.util.spec_from_file_location("horovod_compat", COMPAT)
        compat = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compat)
        here = os.getcwd()
        os.chdir(ROOT)  # the documented commands run from the repository's root
        try:
            for where, argv in commands:
                with self.subTest(where):
                    try:
                        args = compat.parse_args(argv)
                    except SystemExit:
                        self.fail("%s: horovod_compat.py refuses these arguments" % where)
                    # The ranks start in a temporary directory: a relative --python would
                    # name nothing there.
                    self.assertTrue(os.path.isabs(args.python), "%s: --python %s" % (
                        where, args.python))
                    if ".venv-torch" in args.python and not os.path.exists(args.python):
                        continue  # scripts/setup.sh makes .venv-torch
                    self.assertTrue(os.access(args.python, os.X_OK),
                                    "%s: --python %s does not exist" % (where, args.python))
        finally:
            os.chdir(here)


if __name__ == "__main__":
    unittest.main()
