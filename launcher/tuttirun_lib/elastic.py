"""Elastic jobs: tuttirun --min-np/--max-np/--host-discovery-script (docs/elastic.md).

The driver keeps the workers of a job whose world may shrink and grow, in generations:
 1. Hosts come from --host-discovery-script (its `host:slots` lines, read every
    --discovery-interval seconds) or from -H/--hostfile (fixed).
 2. Workers start on free slots of hosts that are not blacklisted, up to --max-np, once
    --min-np can run. A worker has no rank of its own: it gets TUTTI_ELASTIC_WORKER (an id),
    TUTTI_ELASTIC_GENERATION (the first generation it may join) and TUTTI_ELASTIC_TIMEOUT,
    and asks the rendezvous server for its seat at each init (backends/elastic.h has that
    protocol). HOROVOD_RANK, HOROVOD_HOSTNAME, ... say its seat in the generation it was
    started for, as horovodrun's do.
 3. An event (a worker failed, a host went away, slots appeared) makes a new generation: the
    surviving workers, ranked in their old order, then the new ones. Survivors are the same
    processes: they learn of it from a failed collective (a dead peer) or from
    hvd.elastic's check_host_updates() at their next commit, and init again.
 4. A failed worker's host is blacklisted for a cool-down (--blacklist-cooldown-range, doubling
    with each failure there): no worker starts there meanwhile, and its other workers are
    stopped (as horovodrun does; --keep-host-workers keeps them). Workers of a host that
    discovery no longer lists (or of slots it no longer lists) have no seat in the next
    generation: they leave at their next commit, or are stopped after REMOVED_GRACE_SECONDS.
 5. The job fails when no worker of the last generation is left (the training state is
    lost), when fewer than --min-np workers are left for longer than --elastic-timeout, or
    when --reset-limit generations after the first were not enough. A discovery run that
    fails after the first is a warning (the hosts stay as they were) until discovery has
    failed for --elastic-timeout. The job ends when every worker has exited and one exited
    0 (then no new generation starts).
"""
import os
import shlex
import signal
import subprocess
import sys
import time

from . import hosts as hostlib
from .environment import local_environment, remote_environment
from .spawn import Job, remote_command

POLL_SECONDS = 0.05
# How long a worker that has no seat in the newest generation (discovery dropped its host
# or slot) may keep running to reach its next commit, where it leaves by itself.
REMOVED_GRACE_SECONDS = 30.0


class ElasticError(Exception):
    pass


class ElasticOptions:
    def __init__(self, np, min_np, max_np, discovery_script, fixed_hosts, slots,
                 elastic_timeout, reset_limit, cooldown_range, discovery_interval,
                 keep_host_workers=False):
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.discovery_script, self.fixed_hosts, self.slots = discovery_script, fixed_hosts, slots
        self.elastic_timeout, self.reset_limit = elastic_timeout, reset_limit
        self.cooldown_range, self.discovery_interval = cooldown_range, discovery_interval
        self.keep_host_workers = keep_host_workers


def parse_discovery_output(text, default_slots, script):
    """`host:slots` or `host` lines (the latter get --slots) -> [(host, slots)]."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, slots = line.rpartition(":") if line.count(":") == 1 else (line, "", "")
        if not sep:
            name, slots = line, None
        where = "%s, line %d" % (script, number)
        try:
            found.append((name, hostlib._parse_slots(slots, where) if slots else default_slots))
        except hostlib.HostError as e:
            raise ElasticError(str(e))
    return hostlib.merge_repeated(found)


def discover(script, default_slots, timeout):
    """Runs the discovery script once (bounded by `timeout`); [(host, slots)]."""
    try:
        out = subprocess.run([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ElasticError("--host-discovery-script %s did not finish within %g s" % (
            script, timeout))
    except OSError as e:
        raise ElasticError("--host-discovery-script %s cannot run: %s" % (script, e))
    if out.returncode != 0:
        raise ElasticError("--host-discovery-script %s exited with code %d: %s" % (
            script, out.returncode, out.stderr.decode(errors="replace").strip()[:400]))
    return parse_discovery_output(out.stdout.decode(errors="replace"), default_slots, script)


class HostBook:
    """Slots per host, and the blacklist with its cool-downs."""

    def __init__(self, cooldown_range):
        self.slots = {}          # host -> slots, in discovery order
        self.failures = {}       # host -> failures so far
        self.until = {}          # host -> monotonic time its cool-down ends
        self.cooldown_range = cooldown_range

    def blacklist(self, host, now):
        """Starts a cool-down of 2 x MIN at a host's first failure, doubling with each later
        one, at most MAX (horovodrun's, without its random part); a failure during a
        cool-down does not lengthen it. Returns the seconds left."""
        if self.until.get(host, 0) <= now:
            self.failures[host] = self.failures.get(host, 0) + 1
            lo, hi = self.cooldown_range
            self.until[host] = now + max(lo, min(hi, lo * 2 ** self.failures[host]))
        return self.until[host] - now

    def usable(self, host, now):
        return host in self.slots and self.until.get(host, 0) <= now


class Driver:
    """Runs one elastic job; run() returns tuttirun's exit code."""

    def __init__(self, options, command, env, secret, server, forwarder, spawn_options,
                 log=None):
        self.o, self.command, self.env, self.secret = options, command, env, secret
        self.server, self.spawn_options = server, spawn_options
        self.job = Job(forwarder)
        self.log = log or (lambda m: print("tuttirun: " + m, file=sys.stderr, flush=True))
        self.book = HostBook(options.cooldown_range)
        self.local = {}
        self.live = []           # workers of the job, in rank order of the last generation
        self.published = []      # the last generation's workers
        self.new = []            # workers started for the next generation
        self.generation = -1
        self.resets = 0
        self.next_id = 0
        self.finishing = False   # a worker exited 0: training is over, no new generation
        self.result = None
        self.below_min_since = None
        self.failures = []       # "w0 (exit code 1 on localhost)", in the order they came
        self.discovered_at = None  # when discovery last succeeded
        self.discovery_failing = False

    # ---- hosts and workers ----
    def refresh_hosts(self, now):
        if self.o.discovery_script:
            try:
                found = discover(self.o.discovery_script, self.o.slots,
                                 max(1.0, self.o.discovery_interval * 5))
            except ElasticError as e:
                # Only the first discovery is fatal (a misconfiguration); later ones may be
                # slow or fail for a while: the hosts stay as they were.
                if self.discovered_at is None or \
                        now - self.discovered_at > self.o.elastic_timeout:
                    if self.discovered_at is not None:
                        raise ElasticError("%s; no discovery succeeded for more than "
                                           "--elastic-timeout %g s" % (
                                               e, self.o.elastic_timeout))
                    raise
                if not self.discovery_failing:
                    self.log("warning: %s; keeping the hosts found last (%s)" % (
                        e, self.describe_hosts(now)))
                self.discovery_failing = True
                return
            if self.discovery_failing:
                self.log("--host-discovery-script %s works again" % self.o.discovery_script)
            self.discovery_failing = False
            self.discovered_at = now
        else:
            found = self.o.fixed_hosts
        new = dict(found)
        gone = [h for h in self.book.slots if h not in new or new[h] < self.book.slots[h]]
        self.book.slots = new
        for host in gone:  # fewer slots: the newest workers there go
            here = [w for w in self.live if w.slot.host == host and not w.stopping]
            for w in here[new.get(host, 0):]:
                self.log("host %s: %s; worker %s has no seat in the next generation" % (
                    host, "no longer discovered" if host not in new else
                    "now %d slot(s)" % new[host], w.wid))
                self.stop_worker(w, now + REMOVED_GRACE_SECONDS)

    def free_slots(self, now):
        used = {}
        for w in self.live + self.new:
            used[w.slot.host] = used.get(w.slot.host, 0) + 1
        for host, count in self.book.slots.items():
            if self.book.usable(host, now):
                for _ in range(count - used.get(host, 0)):
                    yield host

    def seats(self, hosts):
        """The Slots (rank, local and cross ranks) of a world of workers on `hosts`."""
        slots, on_host = [], {}
        for rank, host in enumerate(hosts):
            slots.append(hostlib.Slot(rank, host, on_host.get(host, 0)))
            on_host[host] = on_host.get(host, 0) + 1
        return hostlib.describe_world(slots)

    def spawn(self, host, seat, size):
        wid = self.next_id
        self.next_id += 1
        slot = hostlib.Slot(wid, host, 0)
        horovod = {k: v for k, v in seat.env(size).items() if k.startswith("HOROVOD_")}
        env = dict(self.env, TUTTI_ELASTIC_WORKER="w%d" % wid,
                   TUTTI_ELASTIC_GENERATION=str(self.generation + 1),
                   TUTTI_ELASTIC_TIMEOUT=str(self.o.elastic_timeout + 10), **horovod)
        if host not in self.local:
            self.local[host] = hostlib.is_local(host)
        if self.local[host]:
            self.job.start_local(slot, self.command, local_environment(env, self.secret))
        else:
            argv, stdin = remote_command(host, self.command, remote_environment(env),
                                         os.getcwd(), self.secret, *self.spawn_options)
            self.job.start_remote(slot, argv, stdin)
        w = self.job.workers[-1]
        w.stopping, w.stop_at = False, None
        w.wid = "w%d" % wid
        self.job.forwarder.attach(wid, "stdout", w.popen.stdout)
        self.job.forwarder.attach(wid, "stderr", w.popen.stderr,
                                  w.watch_stderr if w.popen.stdin else None)
        self.new.append(w)

    def stop_worker(self, w, at=None):
        """Stops `w` (SIGTERM) now, or at monotonic time `at` if it has not left by then; its
        exit does not count."""
        w.stopping = True
        w.stop_at = at
        if at is None:
            w.signal(signal.SIGTERM)

    def stop_lingering(self, now):
        """Stops the workers that lost their seat once the generation without them has
        formed (every member took its seat there), or at their grace deadline."""
        lingering = [w for w in self.job.workers if w.returncode is None and w.stopping and
                     w.stop_at is not None]
        if not lingering:
            return
        formed = all(self.joined(w) == self.generation for w in self.published)
        for w in lingering:
            if formed or now >= w.stop_at or self.finishing:
                if not formed and not self.finishing:
                    self.log("worker %s has not left %g s after it lost its seat: stopping "
                             "it" % (w.wid, REMOVED_GRACE_SECONDS))
                w.stop_at = None
                w.signal(signal.SIGTERM)

    # ---- generations ----
    def publish(self):
        world = [w for w in self.live if not w.stopping] + self.new
        g = self.generation + 1
        seats = {w.wid: "%d %d" % (rank, len(world)) for rank, w in enumerate(world)}
        for w in self.job.workers:
            if w.returncode is None:
                self.server.put(("elastic/g%d/seat/%s" % (g, w.wid)).encode(),
                                seats.get(w.wid, "none").encode())
        self.server.add(b"elastic/published", 1)
        self.generation = g
        self.live, self.new = world, []
        self.published = list(world)
        self.log("generation %d: %d worker(s) (%s)" % (g, len(world), ", ".join(
            "%s rank %d on %s" % (w.wid, r, w.slot.host) for r, w in enumerate(world))))

    def fail(self, message, code=1):
        if self.failures:
            message += "; failed worker(s): " + ", ".join(self.failures)
        self.log("error: " + message)
        self.result = code
        return code

    def poll_workers(self, now):
        """Reaps exited workers, counts failures against their hosts."""
        for w in self.job.workers:
            if w.returncode is not None:
                continue
            code = w.popen.poll()
            if code is None:
                continue
            w.returncode = code
            if w in self.new:
                self.new.remove(w)
            if w.stopping:
                continue
            if code == 0:
                if not self.finishing:
                    self.finish(w)
                continue
            if self.finishing:
                self.result = self.result or w.exit_status()
                self.log(w.describe_exit().replace("rank %d" % w.rank, "worker " + w.wid))
                continue
            cut_off = w.popen.stdin is not None and code == 255
            cool = self.book.blacklist(w.slot.host, now)
            self.failures.append("%s (%s on %s)" % (w.wid, "killed by signal %d" % -code
                                                    if code < 0 else "exit code %d" % code,
                                                    w.slot.host))
            with_others = cut_off or not self.o.keep_host_workers
            self.log("%s; host %s blacklisted for %g s%s" % (
                w.describe_exit().replace("rank %d" % w.rank, "worker " + w.wid),
                w.slot.host, cool, " with its workers" if with_others else ""))
            if with_others:
                for other in self.live + self.new:
                    if other.slot.host == w.slot.host and other is not w and \
                            other.returncode is None and not (other.stopping and
                                                              other.stop_at is None):
                        self.stop_worker(other)
        if not self.finishing:
            self.live = [w for w in self.live if w.returncode is None]

    def joined(self, w):
        """The generation `w` took its seat in last (its init says so), None before."""
        value = self.server.peek(("elastic/joined/%s" % w.wid).encode())
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def finish(self, w):
        """`w` exited 0: training is over, in the generation `w` ran in last. Its other
        workers finish too; workers not in that generation (a replacement started for a
        newer one, which can never be complete now) are stopped, and do not count."""
        self.finishing = True
        done = self.joined(w)
        self.log("worker %s finished%s; waiting for the others" % (
            w.wid, "" if done is None else " in generation %d" % done))
        if done is None:
            return
        for other in self.job.workers:
            if other.returncode is None and not other.stopping and self.joined(other) != done:
                self.log("worker %s is not in generation %d, where the job finished: "
                         "stopping it" % (other.wid, done))
                self.stop_worker(other)

    def step(self, now):
        """Publishes a generation (with new workers on free slots, up to --max-np) when the
        world changed; or waits for enough slots; or fails."""
        survivors = [w for w in self.live if not w.stopping]
        if self.generation >= 0 and not survivors:
            return self.fail("no worker of generation %d is left, so the training state is "
                             "lost: stopping the job (hosts: %s)" % (
                                 self.generation, self.describe_hosts(now)))
        room = max(0, self.o.max_np - len(survivors)) if self.o.max_np else None
        hosts = list(self.free_slots(now))[:room]  # None: every free slot
        count = len(survivors) + len(hosts)
        if count < self.o.min_np:
            if self.below_min_since is None:
                self.below_min_since = now
                self.log("%d worker(s), fewer than --min-np %d: waiting up to %g s "
                         "(--elastic-timeout) for hosts" % (count, self.o.min_np,
                                                            self.o.elastic_timeout))
            if now - self.below_min_since > self.o.elastic_timeout:
                return self.fail("%d worker(s) left, fewer than --min-np %d, for more than "
                                 "--elastic-timeout %g s; stopping the job (hosts: %s)" % (
                                     count, self.o.min_np, self.o.elastic_timeout,
                                     self.describe_hosts(now)))
            return None
        self.below_min_since = None
        if not hosts and survivors == self.published:
            return None
        if self.generation >= 0:
            self.resets += 1
            if self.o.reset_limit is not None and self.resets > self.o.reset_limit:
                return self.fail("reset limit reached: %d generation(s) after the first "
                                 "(--reset-limit %d); stopping the job" % (
                                     self.resets - 1, self.o.reset_limit))
        seats = self.seats([w.slot.host for w in survivors] + hosts)
        for host, seat in zip(hosts, seats[len(survivors):]):
            self.spawn(host, seat, len(seats))
        self.publish()
        return None

    def describe_hosts(self, now):
        return ", ".join("%s:%d%s" % (h, n, " (blacklisted %d s more)" % (
            self.book.until[h] - now) if not self.book.usable(h, now) else "")
            for h, n in self.book.slots.items()) or "none discovered"

    def run(self):
        next_discovery = 0.0
        if self.o.discovery_script:  # cli.py's first run succeeded: later ones may fail
            self.discovered_at = time.monotonic()
        try:
            while self.result is None:
                now = time.monotonic()
                self.poll_workers(now)
                if self.job.interrupted is not None:
                    self.log("received %s, stopping the job" % signal.Signals(
                        self.job.interrupted).name)
                    self.result = 128 + self.job.interrupted
                    break
                self.stop_lingering(now)
                if self.finishing:
                    if all(w.returncode is not None for w in self.job.workers):
                        self.result = self.result or 0
                    time.sleep(POLL_SECONDS)
                    continue
                if now >= next_discovery:
                    next_discovery = now + self.o.discovery_interval
                    self.refresh_hosts(now)
                self.step(now)
                time.sleep(POLL_SECONDS)
        except ElasticError as e:
            self.fail(str(e))
        finally:  # whatever happened, no worker outlives the driver
            self.job.stop()
            self.job.forwarder.join(5.0)
        return self.result


def run_elastic(args, env, secret, server, forwarder):
    """tuttirun's elastic mode (cli.py decides when). Returns the exit code."""
    fixed = None
    if not args.host_discovery_script:
        if args.hosts:
            fixed = hostlib.parse_hosts(args.hosts)
        elif args.hostfile:
            fixed = hostlib.parse_hostfile(args.hostfile)
        else:
            fixed = [("localhost", args.np)]
    cooldown = tuple(args.blacklist_cooldown_range or (60.0, 600.0))
    if not 0 < cooldown[0] <= cooldown[1]:
        raise ElasticError("--blacklist-cooldown-range %g %g: expected 0 < MIN <= MAX" % cooldown)
    options = ElasticOptions(
        np=args.np, min_np=args.min_np or args.np, max_np=args.max_np,
        discovery_script=args.host_discovery_script, fixed_hosts=fixed,
        slots=args.slots or 1, elastic_timeout=args.elastic_timeout,
        reset_limit=args.reset_limit, cooldown_range=cooldown,
        discovery_interval=args.discovery_interval,
        keep_host_workers=getattr(args, "keep_host_workers", False))
    if options.max_np is not None and options.max_np < options.min_np:
        raise ElasticError("--max-np %d is below --min-np %d" % (options.max_np, options.min_np))
    if options.min_np > options.np:
        raise ElasticError("--min-np %d is above -np %d" % (options.min_np, options.np))
    spawn_options = (args.ssh_port, args.ssh_identity_file, args.start_timeout or 30)
    driver = Driver(options, args.command, env, secret, server, forwarder, spawn_options)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, driver.job.on_signal)
    if args.verbose:
        print("tuttirun: elastic job: %s" % " ".join(shlex.quote(a) for a in args.command),
              file=sys.stderr, flush=True)
    server.start()
    try:
        return driver.run()
    finally:
        server.stop()
