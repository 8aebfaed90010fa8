"""Tutti's own log lines carry the local date and time when asked: tuttirun
--log-with-timestamp, TUTTI_LOG_HIDE_TIME=0 or its Horovod twin HOROVOD_LOG_HIDE_TIME=0; the
default and --log-without-timestamp keep them without. Real 2-rank jobs over libtutti
(TUTTI_LIB) that init at --log-level info and shut down."""
import os
import re
import time
import unittest

from launcher_test_util import PYTHON, run

LIB = os.environ.get("TUTTI_LIB", "")
JOB = ("import ctypes, os, sys; lib = ctypes.CDLL(os.environ['TUTTI_LIB']); "
       "sys.exit(lib.tutti_init() or lib.tutti_shutdown())")
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} "


@unittest.skipUnless(LIB, "TUTTI_LIB (libtutti.so) is not set")
class LogTimestampTest(unittest.TestCase):
    def job(self, *flags):
        r = run(["-np", "2", "--log-level", "info"] + list(flags) + [PYTHON, "-c", JOB],
                env=dict(os.environ, TUTTI_LIB=LIB, TUTTI_TIMEOUT_SECONDS="60"), timeout=90)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stderr.splitlines() if "[tutti info rank 0]" in l]
        self.assertTrue(lines, r.stderr)
        return lines

    def test_with_timestamp(self):
        for flags in (["--log-with-timestamp"], ["--no-log-hide-timestamp"],
                      ["-x", "HOROVOD_LOG_HIDE_TIME=0"], ["-x", "TUTTI_LOG_HIDE_TIME=0"]):
            with self.subTest(flags=flags):
                before = time.time()
                for line in self.job(*flags):
                    self.assertRegex(line, r"^\[0\]<stderr>:%s\[tutti info rank 0\] " % STAMP)
                    stamp = re.search(STAMP, line).group(0).split(".")[0]
                    logged = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
                    self.assertTrue(before - 1 <= logged <= time.time() + 1, line)

    def test_without_timestamp(self):
        for flags in ([], ["--log-without-timestamp"], ["-x", "HOROVOD_LOG_HIDE_TIME=1"]):
            with self.subTest(flags=flags):
                for line in self.job(*flags):
                    self.assertTrue(line.startswith("[0]<stderr>:[tutti info rank 0] "), line)


if __name__ == "__main__":
    unittest.main()
