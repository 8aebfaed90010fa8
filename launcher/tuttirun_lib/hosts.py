"""Host lists (-H / --hostfile), rank placement and local-host detection."""
import socket
import struct


class HostError(ValueError):
    pass


def _parse_slots(text, where):
    try:
        slots = int(text)
    except ValueError:
        raise HostError("%s: slots must be a positive integer, got %r" % (where, text))
    if slots < 1:
        raise HostError("%s: slots must be a positive integer, got %d" % (where, slots))
    return slots


def merge_repeated(hosts):
    """A host named more than once gets the sum of its slots, at its first place: PBS and SGE
    nodefiles list a host once per slot, and mpirun adds repeated entries up the same way."""
    order, slots = [], {}
    for name, count in hosts:
        if name not in slots:
            order.append(name)
            slots[name] = 0
        slots[name] += count
    return [(name, slots[name]) for name in order]


def parse_hosts(spec):
    """'h1:2,h2:4,h3' -> [('h1', 2), ('h2', 4), ('h3', 1)]; 'h1,h1,h2' -> [('h1', 2), ('h2', 1)]."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if item.count(":") == 1:
            name, slots = item.split(":")
            hosts.append((name, _parse_slots(slots, "-H %s" % item)))
        else:  # a bare name, or an IPv6 address without slots
            hosts.append((item, 1))
    if not hosts:
        raise HostError("-H %r names no host" % spec)
    return merge_repeated(hosts)


def parse_hostfile(path):
    """Lines 'host slots=N' (or 'host:N' or 'host', one line per slot as PBS/SGE/LSF write
    them); '#' starts a comment; a repeated host adds up."""
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            where = "%s:%d" % (path, number)
            fields = line.split()
            name, slots = fields[0], 1
            if ":" in name and name.count(":") == 1:
                name, text = name.split(":")
                slots = _parse_slots(text, where)
            for field in fields[1:]:
                if field.startswith("slots="):
                    slots = _parse_slots(field[len("slots="):], where)
                elif field.startswith("max_slots=") or field.startswith("max-slots="):
                    pass
                else:
                    raise HostError("%s: unexpected %r (expected 'host slots=N')" % (where,
                                                                                   field))
            hosts.append((name, slots))
    if not hosts:
        raise HostError("hostfile %s names no host" % path)
    return merge_repeated(hosts)


class Slot:
    """One process of the job: its rank and where it runs."""

    def __init__(self, rank, host, local_rank):
        self.rank, self.host, self.local_rank = rank, host, local_rank
        self.local_size = self.cross_rank = self.cross_size = 0

    def env(self, size):
        """TUTTI_{RANK,SIZE,...} for this process, and the HOROVOD_* twins (and
        HOROVOD_HOSTNAME) that scripts written for horovodrun read."""
        values = {"RANK": self.rank, "SIZE": size, "LOCAL_RANK": self.local_rank,
                  "LOCAL_SIZE": self.local_size, "CROSS_RANK": self.cross_rank,
                  "CROSS_SIZE": self.cross_size}
        env = {prefix + key: str(value) for key, value in values.items()
               for prefix in ("TUTTI_", "HOROVOD_")}
        env["HOROVOD_HOSTNAME"] = self.host  # the host as -H or discovery names it
        return env


def place(hosts, np):
    """Fills hosts in order up to their slots. Local ranks count within a host; cross ranks
    count the hosts that have a process with the same local rank (as Horovod does)."""
    total = sum(slots for _, slots in hosts)
    if np > total:
        raise HostError("-np %d asks for more processes than the hosts have slots (%d: %s)" %
                        (np, total, ", ".join("%s:%d" % h for h in hosts)))
    slots, rank = [], 0
    for host, count in hosts:
        for local in range(count):
            if rank == np:
                break
            slots.append(Slot(rank, host, local))
            rank += 1
    return describe_world(slots)


def describe_world(slots):
    """Sets the local and cross sizes (and cross ranks) of `slots`, a world in rank order
    whose local ranks are set."""
    by_host = {}
    for s in slots:
        by_host.setdefault(s.host, []).append(s)
    for group in by_host.values():
        for s in group:
            s.local_size = len(group)
    by_local = {}
    for s in slots:
        by_local.setdefault(s.local_rank, []).append(s)
    for group in by_local.values():
        for index, s in enumerate(group):
            s.cross_rank, s.cross_size = index, len(group)
    return slots


def is_local(host):
    """localhost, 127.x, ::1, this machine's names, or any address bound here."""
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((addr[0], 0))  # succeeds only for an address of this machine
                return True
        except OSError:
            continue
    return False


def interface_address(iface):
    """IPv4 address of a network interface (SIOCGIFADDR)."""
    import fcntl
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))
        except OSError as e:
            raise HostError("--network-interface %s: no IPv4 address (%s)" % (iface, e))
    return socket.inet_ntoa(packed[20:24])


def address_toward(host):
    """The local address the kernel uses to reach `host` (no packet is sent)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 9, proto=socket.IPPROTO_UDP)[0]
    except socket.gaierror as e:
        raise HostError("host '%s': cannot resolve its name (%s)" % (host, e.strerror))
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]
