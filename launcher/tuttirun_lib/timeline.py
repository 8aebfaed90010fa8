"""tutti-timeline: merge the ranks' timeline files into one trace, and summarize a trace.

A rank's file (TUTTI_TIMELINE=dir/ -> dir/rank-N.json) is a JSON array with one event per
line. A rank killed by a signal leaves it without its closing bracket, and possibly with a
last line cut short; both are accepted here (the cut line is dropped and counted). Every
rank's timestamps are on the job clock (rank 0's, offsets measured at init), so merging
is concatenation: each rank stays its own process (pid = rank) in the merged trace.
"""
import argparse
import glob
import json
import os
import sys


def load(path):
    """Events of one timeline file and the number of lines that could not be read."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        events = json.loads(text)
        if isinstance(events, dict):
            events = events.get("traceEvents", [])
        return list(events), 0
    except ValueError:
        pass
    events, bad = [], 0
    for line in text.splitlines():
        line = line.strip()
        if line in ("", "[", "]"):
            continue
        if line.endswith(","):
            line = line[:-1]
        try:
            events.append(json.loads(line))
        except ValueError:
            bad += 1  # the last event of a killed rank, cut short
    return events, bad


def rank_files(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = glob.glob(os.path.join(p, "rank-*.json"))
            files += sorted(found, key=lambda f: int(os.path.basename(f)[5:-5])
                            if os.path.basename(f)[5:-5].isdigit() else -1)
        else:
            files.append(p)
    return files


def merge(paths, out_path):
    files = rank_files(paths)
    if not files:
        raise SystemExit("tutti-timeline: no timeline files in %s (expected rank-N.json)"
                         % ", ".join(paths))
    meta, events, notes = [], [], []
    for f in files:
        evs, bad = load(f)
        clock = [e for e in evs if e.get("name") == "job_clock"]
        err = clock[0].get("args", {}).get("error_us") if clock else None
        notes.append("%s: %d events%s%s" % (
            f, len(evs), ", %d cut line(s) dropped (the rank was killed)" % bad if bad else "",
            ", clock error +-%s us" % err if err is not None else ""))
        for e in evs:
            (meta if e.get("ph") == "M" else events).append(e)
    events.sort(key=lambda e: e.get("ts", 0))
    with open(out_path, "w") as out:
        out.write("[\n")
        out.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in meta + events))
        out.write("\n]\n")
    return notes


def spans(events):
    """(pid, tid, name, ts, dur) of every complete phase: B/E pairs and X events."""
    stacks = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        ph, key = e.get("ph"), (e.get("pid"), e.get("tid"))
        if ph == "X":
            yield key[0], key[1], e.get("name"), e["ts"], e.get("dur", 0)
        elif ph == "B":
            stacks.setdefault(key, []).append(e)
        elif ph == "E" and stacks.get(key):
            b = stacks[key].pop()
            yield key[0], key[1], b.get("name"), b["ts"], e["ts"] - b["ts"]


def summary(paths, out=sys.stdout):
    events = []
    for f in rank_files(paths):
        events += load(f)[0]
    rows = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            rows[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    by_phase = {}
    for pid, tid, name, _, dur in spans(events):
        s = by_phase.setdefault(name, [0, 0, 0])
        s[0] += 1
        s[1] += dur
        s[2] = max(s[2], dur)
    print("%-28s %8s %12s %10s %10s" % ("phase", "count", "total ms", "mean us", "max us"),
          file=out)
    for name, (n, total, worst) in sorted(by_phase.items(), key=lambda kv: -kv[1][1]):
        print("%-28s %8d %12.3f %10.1f %10d" % (name, n, total / 1000.0, total / n, worst),
              file=out)
    return by_phase, rows


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="tutti-timeline",
        description="Merge and summarize Tutti timelines (docs/troubleshooting.md).")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge rank-N.json files into one trace for Perfetto "
                                     "or chrome://tracing")
    m.add_argument("paths", nargs="+", help="timeline directories or files")
    m.add_argument("-o", "--output", required=True, help="the merged trace")
    s = sub.add_parser("summary", help="time per phase over all ranks")
    s.add_argument("paths", nargs="+", help="timeline directories or files")
    args = p.parse_args(argv)
    if args.command == "merge":
        for note in merge(args.paths, args.output):
            print(note, file=sys.stderr)
        print("wrote %s" % args.output, file=sys.stderr)
    else:
        summary(args.paths)
    return 0
