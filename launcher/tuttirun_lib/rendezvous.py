"""The job's authenticated key-value rendezvous server (and a Python client for it).

Wire protocol, version 2, integers little-endian (the C++ client is
backends/gloo/rendezvous_client.cc; backends/gloo/rendezvous_server.cc is a C++ server of it,
with the same limits, that rank 0 hosts under plain srun):
 1. On accept the server sends a hello: "TUTH", version 2, a 16-byte random nonce.
 2. The client proves that it holds the job secret before anything else: "TUTC" and
    HMAC-SHA256(secret, b"tutti-rdzv-auth" + nonce), 36 bytes. Until those 36 bytes have
    arrived and verified, a connection costs the server one descriptor and a 36-byte buffer:
    no thread, no memory budget. A connection that has not proved the secret within
    auth_timeout (2 s) of its accept is closed; when max_pending such connections are open,
    the oldest is closed to make room for the new one.
 3. The server answers the proof with a response (below) of seq 0: OK, UNAUTHENTICATED (then
    it closes), or BUSY when all max_connections authenticated slots are taken (it closes;
    the client retries with backoff until its start deadline). The response's HMAC shows the
    client that the server holds the secret too.
 4. Request: 32-byte header "TUTQ", op, 3 zero bytes, u64 seq, u32 timeout_ms, u32 key_len,
    u64 value_len; key; value; HMAC-SHA256(secret, b"tutti-rdzv-req" + nonce + header + key +
    value). seq is 1 for the first request of a connection and grows by one, so a request
    cannot be replayed on its own connection, nor on another (other nonce).
 5. Response: 24-byte header "TUTA", status, 3 zero bytes, u64 seq, u64 payload_len; payload;
    HMAC-SHA256(secret, b"tutti-rdzv-resp" + nonce + header + payload).
 Ops: SET key value | GET key (waits up to timeout_ms) | WAIT value=u32-prefixed keys |
 ADD key value=i64 delta (returns the new i64).
 A malformed, oversized, replayed or unauthenticated request is answered with an error
 status and the connection is closed. A request whose body would take the bytes in flight
 over max_inflight_bytes is answered BUSY (retry later). Each connection has a deadline for
 every message it has started to send and an idle limit between messages; the server never
 waits unbounded.
"""
import collections
import hashlib
import hmac
import os
import random
import selectors
import socket
import struct
import threading
import time

VERSION = 2
HELLO = struct.Struct("<4sB16s")
PROOF = struct.Struct("<4s32s")
REQUEST = struct.Struct("<4sB3xQIIQ")
RESPONSE = struct.Struct("<4sB3xQQ")
MAC_BYTES = 32

OP_SET, OP_GET, OP_WAIT, OP_ADD = 1, 2, 3, 4
OK, TIMED_OUT, BAD_REQUEST, UNAUTHENTICATED, BUSY = 0, 1, 2, 3, 4

MAX_KEY = 4096
MAX_VALUE = 64 << 20
MAX_WAIT_MS = 24 * 3600 * 1000


def _mac(secret, label, *parts):
    h = hmac.new(secret, label, hashlib.sha256)
    for part in parts:
        h.update(part)
    return h.digest()


def proof_of_secret(secret, nonce):
    """The client's first message: it holds the secret (step 2 of the protocol)."""
    return PROOF.pack(b"TUTC", _mac(secret, b"tutti-rdzv-auth", nonce))


class ProtocolError(Exception):
    pass


def _recv_exact(sock, n, deadline):
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline passed")
        sock.settimeout(left)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class _Pending:
    """A connection that has not proved the secret yet: its nonce, deadline and bytes."""

    def __init__(self, nonce, deadline):
        self.nonce, self.deadline, self.data = nonce, deadline, b""


class RendezvousServer:
    """KV server. Thread-safe; start() returns the bound port; stop() closes it.

    One thread (the accept loop) accepts connections and checks their proofs of the secret
    with a selector; only an authenticated connection gets a thread of its own, one of
    max_connections slots."""

    def __init__(self, secret, host="127.0.0.1", port=0, message_timeout=30.0,
                 idle_timeout=3600.0, max_connections=4096, max_inflight_bytes=256 << 20,
                 auth_timeout=2.0, max_pending=1024):
        if len(secret) < 16:
            raise ValueError("rendezvous secret must be at least 16 bytes")
        self.secret = secret
        self.host = host
        self.message_timeout = message_timeout
        self.idle_timeout = idle_timeout
        self.auth_timeout = auth_timeout
        self.max_pending = max_pending
        self._store = {}
        self._cond = threading.Condition()
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        # Bytes of authenticated requests being read, over all connections.
        self._budget_lock = threading.Lock()
        self._inflight = 0
        self._max_inflight = max_inflight_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(4096)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._stopped = False
        self._thread = None
        self.rejected = 0  # requests refused (malformed, oversized, unauthenticated)
        self.dropped = 0   # connections closed before proving the secret (late or evicted)
        self.busy = 0      # authenticated connections or requests answered BUSY
        self.last_error = None

    def start(self):
        self._thread = threading.Thread(target=self._accept_loop, name="tutti-rendezvous",
                                        daemon=True)
        self._thread.start()
        return self.port

    def stop(self):
        self._stopped = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is None:
            self._listener.close()  # else the accept loop closes it on its way out
        with self._cond:
            self._cond.notify_all()

    def keys(self):
        with self._cond:
            return list(self._store)

    def put(self, key, value):
        """SET from the launcher itself (the elastic driver publishes generations so)."""
        self._execute(OP_SET, key, value, 0)

    def peek(self, key):
        """The value of `key` now, or None: the launcher's own read, which never waits."""
        with self._cond:
            return self._store.get(key)

    def add(self, key, delta):
        """ADD from the launcher itself; returns the new value."""
        return struct.unpack("<q", self._execute(OP_ADD, key, struct.pack("<q", delta), 0)[1])[0]

    def _accept_loop(self):
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        pending = collections.OrderedDict()  # socket -> _Pending, oldest (first deadline) first

        def drop(conn):
            sel.unregister(conn)
            del pending[conn]
            conn.close()

        try:
            while not self._stopped:
                now = time.monotonic()
                while pending:  # deadlines grow in accept order: expired ones are in front
                    conn, state = next(iter(pending.items()))
                    if state.deadline > now:
                        break
                    self.dropped += 1
                    drop(conn)
                wake = next(iter(pending.values())).deadline - now if pending else 0.25
                for key, _ in sel.select(min(max(wake, 0.0), 0.25)):
                    conn = key.fileobj
                    try:
                        if conn is self._listener:
                            self._accept_some(sel, pending, drop)
                        elif conn in pending:
                            self._read_proof(conn, pending[conn], sel, pending)
                    except Exception as e:  # one connection's trouble ends it, not the loop
                        self.last_error = repr(e)
                        if conn in pending:
                            drop(conn)
        finally:
            for conn in list(pending):
                conn.close()
            sel.close()
            self._listener.close()

    def _accept_some(self, sel, pending, drop):
        for _ in range(256):  # bounded: expiry and proofs get their turn between batches
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                if self._stopped:
                    return
                time.sleep(0.05)  # out of descriptors, say: let expiry free some
                return
            if len(pending) >= self.max_pending:
                self.dropped += 1
                drop(next(iter(pending)))  # the oldest unauthenticated connection goes
            nonce = os.urandom(16)
            try:
                conn.setblocking(False)
                conn.send(HELLO.pack(b"TUTH", VERSION, nonce))  # 21 bytes into an empty buffer
            except OSError:
                conn.close()
                continue
            pending[conn] = _Pending(nonce, time.monotonic() + self.auth_timeout)
            sel.register(conn, selectors.EVENT_READ)

    def _read_proof(self, conn, state, sel, pending):
        try:
            chunk = conn.recv(PROOF.size - len(state.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        state.data += chunk
        if chunk and len(state.data) < PROOF.size:
            return
        sel.unregister(conn)
        del pending[conn]
        if not chunk:
            self.dropped += 1
            conn.close()
            return
        if not hmac.compare_digest(state.data, proof_of_secret(self.secret, state.nonce)):
            self._refuse(conn, state.nonce, 0, UNAUTHENTICATED,
                         "the proof of the job secret (HMAC) does not match")
            conn.close()
            return
        if not self._slots.acquire(blocking=False):
            self.busy += 1
            self._refuse(conn, state.nonce, 0, BUSY, "server busy: all %d connection slots "
                         "are taken; retry" % self.max_connections, count=False)
            conn.close()
            return
        try:
            conn.setblocking(True)
            threading.Thread(target=self._serve, args=(conn, state.nonce), daemon=True).start()
        except Exception:  # no thread to be had, say: the slot and the socket go back
            self._slots.release()
            conn.close()
            raise

    def _serve(self, conn, nonce):
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._respond(conn, nonce, 0, OK, b"")
            seq = 0
            while not self._stopped:
                # Idle wait for the next request, then a deadline for the whole message.
                conn.settimeout(self.idle_timeout)
                first = conn.recv(1)
                if not first:
                    return
                deadline = time.monotonic() + self.message_timeout
                header = first + _recv_exact(conn, REQUEST.size - 1, deadline)
                magic, op, req_seq, timeout_ms, key_len, value_len = REQUEST.unpack(header)
                if magic != b"TUTQ" or op not in (OP_SET, OP_GET, OP_WAIT, OP_ADD):
                    return self._refuse(conn, nonce, req_seq, BAD_REQUEST, "malformed request")
                if key_len > MAX_KEY or value_len > MAX_VALUE:
                    return self._refuse(conn, nonce, req_seq, BAD_REQUEST,
                                        "request too large: key %d bytes (max %d), value %d "
                                        "bytes (max %d)" % (key_len, MAX_KEY, value_len,
                                                            MAX_VALUE))
                need = key_len + value_len + MAC_BYTES
                if not self._reserve(need):
                    self.busy += 1
                    return self._refuse(conn, nonce, req_seq, BUSY,
                                        "server busy: too many large requests in flight; "
                                        "retry", count=False)
                try:
                    body = _recv_exact(conn, need, deadline)
                finally:
                    self._release(need)
                key, value = body[:key_len], body[key_len:key_len + value_len]
                expect = _mac(self.secret, b"tutti-rdzv-req", nonce, header, key, value)
                if not hmac.compare_digest(expect, body[-MAC_BYTES:]):
                    return self._refuse(conn, nonce, req_seq, UNAUTHENTICATED,
                                        "HMAC does not match the job secret")
                if req_seq != seq + 1:
                    return self._refuse(conn, nonce, req_seq, UNAUTHENTICATED,
                                        "sequence %d, expected %d (replay?)" % (req_seq,
                                                                               seq + 1))
                seq = req_seq
                try:
                    status, payload = self._execute(op, key, value, min(timeout_ms, MAX_WAIT_MS))
                except ProtocolError as e:
                    return self._refuse(conn, nonce, req_seq, BAD_REQUEST, str(e))
                self._respond(conn, nonce, seq, status, payload)
        except (OSError, ConnectionError, struct.error):
            pass  # timeouts and resets end this connection only
        except Exception as e:  # never let one connection take the server down
            self.rejected += 1
            self.last_error = repr(e)
        finally:
            conn.close()
            self._slots.release()

    def _reserve(self, nbytes):
        with self._budget_lock:
            if self._inflight + nbytes > self._max_inflight and self._inflight > 0:
                return False
            self._inflight += nbytes
            return True

    def _release(self, nbytes):
        with self._budget_lock:
            self._inflight -= nbytes

    def _refuse(self, conn, nonce, seq, status, message, count=True):
        if count:
            self.rejected += 1
        try:
            self._respond(conn, nonce, seq, status, message.encode())
        except OSError:
            pass

    def _frame(self, nonce, seq, status, payload):
        header = RESPONSE.pack(b"TUTA", status, seq, len(payload))
        return header + payload + _mac(self.secret, b"tutti-rdzv-resp", nonce, header, payload)

    def _respond(self, conn, nonce, seq, status, payload):
        if conn.getblocking():
            conn.settimeout(self.message_timeout)
            conn.sendall(self._frame(nonce, seq, status, payload))
        else:  # the accept loop: one try, never wait (the connection is closed after it)
            conn.send(self._frame(nonce, seq, status, payload))

    def _wait_for(self, keys, timeout_ms):
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._store]
                if not missing or self._stopped:
                    return missing
                left = deadline - time.monotonic()
                if left <= 0:
                    return missing
                self._cond.wait(min(left, 1.0))

    def _execute(self, op, key, value, timeout_ms):
        if op == OP_SET:
            with self._cond:
                self._store[key] = value
                self._cond.notify_all()
            return OK, b""
        if op == OP_GET:
            if self._wait_for([key], timeout_ms):
                return TIMED_OUT, b"key '%s' not set after %d ms" % (key, timeout_ms)
            with self._cond:
                return OK, self._store[key]
        if op == OP_WAIT:
            keys, pos = [], 0
            while pos < len(value):
                if pos + 4 > len(value):
                    raise ProtocolError("WAIT: truncated key list")
                (n,) = struct.unpack_from("<I", value, pos)
                if n > MAX_KEY or pos + 4 + n > len(value):
                    raise ProtocolError("WAIT: bad key length")
                keys.append(value[pos + 4:pos + 4 + n])
                pos += 4 + n
            missing = self._wait_for(keys, timeout_ms)
            if missing:
                return TIMED_OUT, b"keys not set after %d ms: %s" % (
                    timeout_ms, b", ".join(missing[:8]))
            return OK, b""
        if len(value) != 8:
            raise ProtocolError("ADD: value must be an 8-byte delta")
        with self._cond:
            old = self._store.get(key, struct.pack("<q", 0))
            if len(old) != 8:
                raise ProtocolError("ADD: key %r holds a non-counter value" % key)
            new = struct.pack("<q", struct.unpack("<q", old)[0] + struct.unpack("<q", value)[0])
            self._store[key] = new
            self._cond.notify_all()
        return OK, new


class RendezvousError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class RendezvousClient:
    """Python client of the same protocol (used by tests and tools). Not thread-safe.
    Connecting retries refused connections and BUSY answers with backoff until `timeout`."""

    def __init__(self, host, port, secret, timeout=30.0):
        self.secret = secret
        self.timeout = timeout
        deadline = time.monotonic() + timeout
        backoff = 0.05
        while True:
            try:
                self._handshake(host, port, deadline)
                return
            except RendezvousError as e:
                if e.status != BUSY or time.monotonic() + backoff >= deadline:
                    raise
            except (ConnectionError, socket.timeout, OSError) as e:
                if time.monotonic() + backoff >= deadline:
                    raise RendezvousError(TIMED_OUT, "could not connect to %s:%d before the "
                                          "deadline: %s" % (host, port, e))
            time.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, 1.0)

    def _handshake(self, host, port, deadline):
        self.sock = socket.create_connection((host, port),
                                             timeout=max(0.01, deadline - time.monotonic()))
        try:
            magic, version, self.nonce = HELLO.unpack(_recv_exact(self.sock, HELLO.size,
                                                                  deadline))
            if magic != b"TUTH" or version != VERSION:
                raise RendezvousError(BAD_REQUEST, "not a tuttirun rendezvous server (or "
                                      "another protocol version)")
            self.sock.sendall(proof_of_secret(self.secret, self.nonce))
            self.seq = 0
            self._reply(deadline)
        except BaseException:
            self.sock.close()
            raise

    def close(self):
        self.sock.close()

    def _reply(self, deadline):
        rheader = _recv_exact(self.sock, RESPONSE.size, deadline)
        magic, status, _, length = RESPONSE.unpack(rheader)
        payload = _recv_exact(self.sock, length, deadline)
        rmac = _recv_exact(self.sock, MAC_BYTES, deadline)
        if magic != b"TUTA":
            raise RendezvousError(BAD_REQUEST, "malformed reply")
        if status == UNAUTHENTICATED:  # signed with the job's secret, which we may not hold
            raise RendezvousError(status, payload.decode(errors="replace"))
        if not hmac.compare_digest(
                rmac, _mac(self.secret, b"tutti-rdzv-resp", self.nonce, rheader, payload)):
            raise RendezvousError(UNAUTHENTICATED, "reply failed authentication")
        if status != OK:
            raise RendezvousError(status, payload.decode(errors="replace"))
        return payload

    def request(self, op, key=b"", value=b"", timeout_ms=0, seq=None):
        self.seq = self.seq + 1 if seq is None else seq
        header = REQUEST.pack(b"TUTQ", op, self.seq, timeout_ms, len(key), len(value))
        mac = _mac(self.secret, b"tutti-rdzv-req", self.nonce, header, key, value)
        self.sock.sendall(header + key + value + mac)
        return self._reply(time.monotonic() + self.timeout + timeout_ms / 1000.0)

    def set(self, key, value):
        self.request(OP_SET, key, value)

    def get(self, key, timeout_ms=30000):
        return self.request(OP_GET, key, timeout_ms=timeout_ms)

    def wait(self, keys, timeout_ms=30000):
        value = b"".join(struct.pack("<I", len(k)) + k for k in keys)
        self.request(OP_WAIT, b"", value, timeout_ms=timeout_ms)

    def add(self, key, delta):
        return struct.unpack("<q", self.request(OP_ADD, key, struct.pack("<q", delta)))[0]
