#!/usr/bin/env python3
"""Plot bus bandwidth against size from tutti-bench --json documents.

Documents of the same configuration (workload, backend, baseline, ranks, dtype, op) are
repeats, as are the cycles of -N: each point is the median over them; the rows of -d all or
-o all are one configuration per type and op. One line per configuration and mode for Tutti
(solid) and, where the run had --baseline, for the bare backend (dashed, same colour).
--table prints the medians as Markdown tables (sweeps, fusion and latency documents alike),
as docs/PERFORMANCE.md shows them; it needs only Python's standard library. -o needs
matplotlib. Installed beside tutti-bench as tutti-bench-plot.

    tutti-bench-plot -o docs/bench_allreduce.png run*.json
    tutti-bench-plot --table run*.json
"""
import argparse
import json
import statistics
import sys
from collections import OrderedDict

MODES = ("out_of_place", "in_place")


def human_bytes(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def config_key(doc):
    return (doc.get("workload"), doc.get("backend"), doc.get("baseline"), doc.get("ranks"),
            doc.get("dtype"), doc.get("op"))


def config_label(key):
    workload, backend, _, ranks, dtype, op = key
    return "%s %s np=%s %s" % (workload, backend, ranks, dtype) + (
        " %s" % op if workload in ("allreduce", "reducescatter") else "")


def split_by_type(doc):
    """A -d all / -o all document: one document per (type, redop) of its rows."""
    by_type = OrderedDict()
    for row in doc.get("rows", []):
        by_type.setdefault((row.get("type"), row.get("redop")), []).append(row)
    if len(by_type) <= 1:
        return [doc]
    docs = []
    for (dtype, redop), rows in by_type.items():
        part = dict(doc)
        part["dtype"], part["op"], part["rows"] = dtype, redop, rows
        docs.append(part)
    return docs


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def sweep_medians(docs):
    """{size: {mode: {field: median}}} over the repeats of one configuration."""
    by_size = OrderedDict()
    for doc in docs:
        for row in doc.get("rows", []):
            entry = by_size.setdefault(row["size"], {"count": row["count"], "runs": {m: [] for m in MODES}})
            for mode in MODES:
                if row.get(mode):
                    entry["runs"][mode].append(row[mode])
    out = OrderedDict()
    for size in sorted(by_size):
        entry = by_size[size]
        out[size] = {"count": entry["count"]}
        for mode in MODES:
            runs = entry["runs"][mode]
            if not runs:
                out[size][mode] = None
                continue
            fields = ("time_us", "busbw", "baseline_time_us", "baseline_busbw", "ratio")
            out[size][mode] = {f: median([r.get(f) for r in runs]) for f in fields}
            out[size][mode]["wrong"] = max(r.get("wrong", 0) for r in runs)
    return out


def fmt(v, spec="%.2f"):
    return "—" if v is None else spec % v


def print_tables(groups):
    for key, docs in groups.items():
        print("#### %s (median of %d run%s)\n" % (config_label(key), len(docs),
                                                  "" if len(docs) == 1 else "s"))
        if any(d.get("rows") for d in docs):
            print("| size | oop time (us) | oop busbw | bare time (us) | bare busbw | ratio "
                  "| in-place time (us) | in-place busbw | bare time (us) | ratio |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for size, row in sweep_medians(docs).items():
                cells = [human_bytes(size)]
                o, i = row["out_of_place"], row["in_place"]
                for m, fields in ((o, ("time_us", "busbw", "baseline_time_us", "baseline_busbw", "ratio")),
                                  (i, ("time_us", "busbw", "baseline_time_us", "ratio"))):
                    cells += [fmt(m.get(f) if m else None) for f in fields]
                print("| " + " | ".join(cells) + " |")
        fusion = [d["fusion"] for d in docs if d.get("fusion")]
        if fusion:
            print("| tensors × bytes | Tutti step (us) | Tutti grouped (us) | bare per-tensor (us) "
                  "| bare packed (us) | Tutti / packed | per-tensor / Tutti |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for idx, row in enumerate(fusion[0]):
                runs = [f[idx] for f in fusion if idx < len(f)]
                t = median([r["tutti_step_us"] for r in runs])
                g = median([r["tutti_grouped_step_us"] for r in runs])
                pt = median([r.get("baseline_per_tensor_us") for r in runs])
                pk = median([r.get("baseline_packed_us") for r in runs])
                print("| %d × %s | %s | %s | %s | %s | %s | %s |" % (
                    row["tensors"], human_bytes(row["tensor_bytes"]), fmt(t, "%.0f"),
                    fmt(g, "%.0f"), fmt(pt, "%.0f"), fmt(pk, "%.0f"),
                    fmt(t / pk if t and pk else None), fmt(pt / t if t and pt else None)))
        latency = [d["latency"] for d in docs if d.get("latency")]
        if latency:
            print("| size | Tutti median (us) | p99 | max | bare median (us) | p99 | max "
                  "| median ratio |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for idx, row in enumerate(latency[0]):
                runs = [l[idx] for l in latency if idx < len(l)]
                tm = [median([r["tutti"][f] for r in runs]) for f in ("median_us", "p99_us", "max_us")]
                bm = [median([r.get("baseline", {}).get(f) for r in runs])
                      for f in ("median_us", "p99_us", "max_us")]
                print("| %d | %s | %s |" % (row["size"], " | ".join(fmt(v) for v in tm + bm),
                                           fmt(tm[0] / bm[0] if bm[0] else None)))
        print()


def plot(groups, args):
    try:
        import matplotlib
    except ImportError as e:
        print("tutti-bench-plot: -o %s needs matplotlib (%s); --table needs only Python"
              % (args.output, e), file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(MODES) if args.mode == "both" else [args.mode]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    plotted = 0
    all_sizes = set()
    for key, docs in groups.items():
        if not any(d.get("rows") for d in docs):
            print("%s: no size sweep to plot" % config_label(key), file=sys.stderr)
            continue
        med = sweep_medians(docs)
        for mode in modes:
            pts = [(s, r[mode]) for s, r in med.items() if s > 0 and r[mode]]
            if not pts:
                continue
            colour = colours[plotted % len(colours)]
            marker = "o" if mode == "out_of_place" else "s"
            short = "oop" if mode == "out_of_place" else "in-place"
            xs = [s for s, _ in pts]
            ax.plot(xs, [m["busbw"] for _, m in pts], "-", marker=marker, color=colour,
                    label="Tutti %s (%s)" % (config_label(key), short))
            base = [(s, m["baseline_busbw"]) for s, m in pts if m["baseline_busbw"] is not None]
            if base:
                ax.plot([s for s, _ in base], [b for _, b in base], "--", marker=marker,
                        color=colour, alpha=0.7, mfc="none",
                        label="bare %s np=%s (%s)" % (key[2], key[3], short))
            all_sizes.update(xs)
            plotted += 1
    if not plotted:
        print("nothing to plot: no document has rows", file=sys.stderr)
        return 1
    ax.set_xscale("log", base=2)
    ticks = sorted(all_sizes)
    if len(ticks) > 12:
        ticks = ticks[:: (len(ticks) + 11) // 12]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_bytes(t) for t in ticks], rotation=45)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, 1e9 B)")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("wrote %s" % args.output)
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="tutti-bench --json outputs")
    parser.add_argument("-o", "--output", help="PNG to write")
    parser.add_argument("--table", action="store_true", help="print Markdown tables of medians")
    parser.add_argument("--mode", choices=MODES + ("both",), default="both")
    parser.add_argument("--title", default="tutti-bench: bus bandwidth vs size")
    args = parser.parse_args(argv)
    if not args.output and not args.table:
        parser.error("nothing to do: give -o FILE.png and/or --table")

    groups = OrderedDict()
    for path in args.json:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print("tutti-bench-plot: %s: expected a tutti-bench --json document: %s" % (path, e),
                  file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or doc.get("tool") != "tutti-bench":
            print("tutti-bench-plot: %s: expected a tutti-bench --json document (\"tool\": "
                  "\"tutti-bench\"), got another JSON value" % path, file=sys.stderr)
            return 2
        for part in split_by_type(doc):
            groups.setdefault(config_key(part), []).append(part)
    if args.table:
        print_tables(groups)
    return plot(groups, args) if args.output else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
