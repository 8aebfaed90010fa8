#!/usr/bin/python3
"""Plot bus bandwidth against size from tutti-bench --json documents.

One line per document and mode for Tutti (solid) and, where the run had --baseline, for the
bare backend (dashed, same colour). Fusion and latency documents have no size sweep and are
listed but not plotted.

    /usr/bin/python3 scripts/plot_bench.py -o docs/bench_allreduce.png run1.json run2.json
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def human_bytes(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def series(doc, mode, key):
    """(sizes, values) of rows whose `mode` ran, for `key` (busbw or baseline_busbw)."""
    xs, ys = [], []
    for row in doc.get("rows", []):
        m = row.get(mode)
        if m and m.get(key) is not None and row["size"] > 0:
            xs.append(row["size"])
            ys.append(m[key])
    return xs, ys


def label_of(doc, path, override):
    if override:
        return override
    return "%s %s np=%d" % (doc.get("workload", "?"), doc.get("backend", "?"), doc.get("ranks", 0))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="tutti-bench --json outputs")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument("--labels", help="comma-separated legend labels, one per document")
    parser.add_argument("--mode", choices=("out_of_place", "in_place", "both"), default="both")
    parser.add_argument("--title", default="tutti-bench: bus bandwidth vs size")
    args = parser.parse_args(argv)

    labels = args.labels.split(",") if args.labels else []
    modes = ["out_of_place", "in_place"] if args.mode == "both" else [args.mode]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    plotted = 0
    all_sizes = set()
    for i, path in enumerate(args.json):
        with open(path) as f:
            doc = json.load(f)
        if not doc.get("rows"):
            print("%s: %s document, no size sweep to plot" % (path, doc.get("workload")),
                  file=sys.stderr)
            continue
        name = label_of(doc, path, labels[i] if i < len(labels) else "")
        for j, mode in enumerate(modes):
            colour = colours[(plotted) % len(colours)]
            xs, ys = series(doc, mode, "busbw")
            if not xs:
                continue
            marker = "o" if mode == "out_of_place" else "s"
            short = "oop" if mode == "out_of_place" else "in-place"
            ax.plot(xs, ys, "-", marker=marker, color=colour, label="Tutti %s (%s)" % (name, short))
            all_sizes.update(xs)
            bx, by = series(doc, mode, "baseline_busbw")
            if bx:
                ax.plot(bx, by, "--", marker=marker, color=colour, alpha=0.7, mfc="none",
                        label="bare %s np=%d (%s)" % (doc.get("baseline"), doc.get("ranks", 0),
                                                      short))
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
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print("wrote %s" % args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
