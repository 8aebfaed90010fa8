"""The rendezvous server: authenticated SET/GET/WAIT/ADD, and refusal of wrong secrets,
replays, malformed, truncated and oversized requests without crashing or hanging, while
good clients keep being served."""
import os
import socket
import struct
import threading
import time
import unittest

import launcher_test_util  # noqa: F401  (puts tuttirun_lib on sys.path)
from tuttirun_lib import rendezvous as rv

SECRET = os.urandom(32)


class RendezvousTest(unittest.TestCase):
    def setUp(self):
        self.server = rv.RendezvousServer(SECRET, message_timeout=1.0, idle_timeout=5.0)
        self.port = self.server.start()
        self.sockets = []

    def tearDown(self):
        for s in self.sockets:
            s.close()
        self.server.stop()

    def client(self, secret=SECRET):
        c = rv.RendezvousClient("127.0.0.1", self.port, secret, timeout=5.0)
        self.sockets.append(c.sock)
        return c

    def assert_still_serves(self):
        c = self.client()
        c.set(b"health", b"ok")
        self.assertEqual(c.get(b"health", 1000), b"ok")
        c.close()

    def closed(self, sock):
        sock.settimeout(5.0)
        try:
            while sock.recv(4096):
                pass
            return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def test_set_get_wait_add(self):
        a, b = self.client(), self.client()
        a.set(b"k", b"v" * 1000)
        self.assertEqual(b.get(b"k"), b"v" * 1000)
        a.set(b"empty", b"")
        self.assertEqual(b.get(b"empty"), b"")
        b.wait([b"k", b"empty"], 1000)
        self.assertEqual(a.add(b"n", 5), 5)
        self.assertEqual(b.add(b"n", -2), 3)

    def test_get_waits_for_a_later_set(self):
        a, b = self.client(), self.client()
        threading.Timer(0.3, lambda: a.set(b"late", b"x")).start()
        start = time.monotonic()
        self.assertEqual(b.get(b"late", 5000), b"x")
        self.assertGreater(time.monotonic() - start, 0.2)

    def test_get_and_wait_time_out(self):
        c = self.client()
        start = time.monotonic()
        with self.assertRaises(rv.RendezvousError) as e:
            c.get(b"never", 300)
        self.assertEqual(e.exception.status, rv.TIMED_OUT)
        self.assertIn("never", str(e.exception))
        with self.assertRaises(rv.RendezvousError) as e:
            c.wait([b"never", b"nor"], 300)
        self.assertEqual(e.exception.status, rv.TIMED_OUT)
        self.assertLess(time.monotonic() - start, 3)

    def test_wrong_secret_is_refused_and_closed(self):
        bad = self.client(os.urandom(32))
        with self.assertRaises(rv.RendezvousError) as e:
            bad.set(b"evil", b"x")
        self.assertEqual(e.exception.status, rv.UNAUTHENTICATED)
        self.assertTrue(self.closed(bad.sock))
        self.assertNotIn(b"evil", self.server.keys())
        self.assert_still_serves()

    def test_replayed_sequence_is_refused(self):
        c = self.client()
        c.set(b"a", b"1")
        with self.assertRaises(rv.RendezvousError) as e:
            c.request(rv.OP_SET, b"a", b"2", seq=1)  # same seq as the first request
        self.assertEqual(e.exception.status, rv.UNAUTHENTICATED)
        self.assertEqual(self.client().get(b"a"), b"1")

    def test_request_replayed_on_another_connection_is_refused(self):
        c = self.client()
        header = rv.REQUEST.pack(b"TUTQ", rv.OP_SET, 1, 0, 1, 1)
        frame = header + b"k" + b"v" + rv._mac(SECRET, b"tutti-rdzv-req", c.nonce, header,
                                                b"k", b"v")
        c.sock.sendall(frame)
        other = self.client()  # other nonce: the captured frame must not verify
        other.sock.sendall(frame)
        self.assertTrue(self.closed(other.sock))
        self.assertEqual(self.client().get(b"k", 1000), b"v")  # the original went through

    def raw(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.sockets.append(s)
        hello = b""
        while len(hello) < rv.HELLO.size:
            hello += s.recv(rv.HELLO.size - len(hello))
        return s

    def test_malformed_magic(self):
        s = self.raw()
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 16)
        data = s.recv(rv.RESPONSE.size)
        self.assertEqual(rv.RESPONSE.unpack(data)[1], rv.BAD_REQUEST)
        self.assertTrue(self.closed(s))
        self.assert_still_serves()

    def test_oversized_value_is_refused_before_reading(self):
        s = self.raw()
        s.sendall(rv.REQUEST.pack(b"TUTQ", rv.OP_SET, 1, 0, 1, (64 << 20) + 1))
        data = s.recv(rv.RESPONSE.size)
        self.assertEqual(rv.RESPONSE.unpack(data)[1], rv.BAD_REQUEST)
        self.assertTrue(self.closed(s))
        s = self.raw()
        s.sendall(rv.REQUEST.pack(b"TUTQ", rv.OP_GET, 1, 0, 5000, 0))  # key too long
        self.assertEqual(rv.RESPONSE.unpack(s.recv(rv.RESPONSE.size))[1], rv.BAD_REQUEST)
        self.assert_still_serves()

    def test_truncated_request_times_out_without_blocking_others(self):
        s = self.raw()
        s.sendall(rv.REQUEST.pack(b"TUTQ", rv.OP_SET, 1, 0, 3, 100)[:20])
        self.assert_still_serves()  # served while the stalled connection waits
        start = time.monotonic()
        self.assertTrue(self.closed(s))
        self.assertLess(time.monotonic() - start, 4)  # message_timeout is 1 s

    def test_memory_budget_for_unauthenticated_bytes(self):
        self.server.stop()
        self.server = rv.RendezvousServer(SECRET, message_timeout=1.0,
                                          max_inflight_bytes=1 << 20)
        self.port = self.server.start()
        hog = self.raw()  # claims 1 MiB, sends none of it: holds the whole budget
        hog.sendall(rv.REQUEST.pack(b"TUTQ", rv.OP_SET, 1, 0, 1, (1 << 20) - 100))
        time.sleep(0.2)
        second = self.raw()
        second.sendall(rv.REQUEST.pack(b"TUTQ", rv.OP_SET, 1, 0, 1, 512 << 10))
        status = rv.RESPONSE.unpack(second.recv(rv.RESPONSE.size))[1]
        self.assertEqual(status, rv.BAD_REQUEST)
        self.assertTrue(self.closed(hog))  # its 1 s message deadline frees the budget
        c = self.client()
        c.set(b"big", b"x" * (512 << 10))
        self.assertEqual(len(c.get(b"big")), 512 << 10)

    def test_garbage_and_bad_wait_list(self):
        for junk in (os.urandom(100), b"\xff" * 32, b""):
            s = self.raw()
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server may already have refused and closed
            self.assertTrue(self.closed(s))
        c = self.client()
        with self.assertRaises(rv.RendezvousError) as e:
            c.request(rv.OP_WAIT, b"", struct.pack("<I", 99) + b"ab", 100)
        self.assertEqual(e.exception.status, rv.BAD_REQUEST)
        self.assert_still_serves()


if __name__ == "__main__":
    unittest.main()
