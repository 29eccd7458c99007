"""Catch slowdowns: save the benchmarks' machine-normalised figures as a baseline for this CPU,
then compare a later run against it.

    python benches/regress.py save    [--quick] [--runs 2]       # run the benches, keep a baseline
    python benches/regress.py compare [--quick] [--tolerance 0.10] [--peer-tolerance 0.05]
                                      [--confirm 2]

`--quick` runs the quick subset (pytest -m quick, under 3 minutes); without it, every benchmark
(llama.cpp, torch and transformers peers included where installed).  Anything after `--` goes to
pytest (e.g. `-- -k attention`).

Figures (written by benches/conftest.py with --hybrid-json): the share of the read bandwidth,
ratios to peers, and tokens/s (or GFLOP/s) per GB/s of read bandwidth, each measured beside its
reference round by round (the median of the rounds' ratios: conftest.paired).  Raw times are not
compared: they move with the machine's load.
A figure regresses when it is worse than the baseline by more than the tolerance (relative):
`--tolerance` for bandwidth shares and per-GB/s rates, `--peer-tolerance` for peer ratios, in the
run and in each of `--confirm` re-runs of the files whose figures regressed (each figure keeps its
better value over the runs: a phase of other load on a shared machine slows one run, a real
slowdown every run).  For the same reason `save` keeps each figure's best of `--runs` runs.
`compare` prints every figure both runs have and exits 1, naming what regressed, if any did;
2 when there is no baseline for this CPU.

Baselines live in benches/baselines/, one file per CPU (vendor, family, model, model name and the
kernels' SIMD path) and subset, so a Zen 3 baseline is never compared with a Zen 4 run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(HERE, "baselines")


def run_benches(quick: bool, pytest_args: list, out: str, paths=None) -> dict:
    """Run the benchmarks (all, or the files in paths) in a subprocess and return the figures
    document they wrote."""
    cmd = [sys.executable, "-m", "pytest", *(paths or [HERE]), "--benchmark-only", "-q",
           "-p", "no:cacheprovider",
           f"--hybrid-json={out}", *(["-m", "quick"] if quick else []), *pytest_args]
    print("running:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc not in (0, 5) or not os.path.exists(out):
        raise SystemExit(f"the benchmark run failed (pytest exit status {rc})")
    with open(out) as f:
        return json.load(f)


def cpu_key(cpu: dict) -> str:
    parts = [cpu.get("vendor_id", ""), f"family{cpu.get('cpu_family', '')}",
             f"model{cpu.get('model', '')}", cpu.get("model_name", ""), cpu.get("simd", "")]
    return re.sub(r"[^a-z0-9]+", "-", "-".join(p for p in parts if p).lower()).strip("-")


def baseline_path(directory: str, cpu: dict, quick: bool) -> str:
    return os.path.join(directory, f"{cpu_key(cpu)}{'-quick' if quick else ''}.json")


def compare(base: dict, new: dict, tolerance: float, peer_tolerance: float):
    """Rows (name, baseline, now, change, allowed, status) and the names that regressed."""
    rows, regressed = [], []
    bf, nf = base["figures"], new["figures"]
    for name in sorted(set(bf) & set(nf)):
        old, now = bf[name]["value"], nf[name]["value"]
        higher = bf[name].get("higher_is_better", True)
        allowed = peer_tolerance if bf[name]["kind"] == "peer_ratio" else tolerance
        change = (now / old - 1.0) if old else 0.0
        worse = -change if higher else change  # > 0: worse by that fraction
        status = "REGRESSED" if worse > allowed else ("better" if worse < -allowed else "ok")
        if status == "REGRESSED":
            regressed.append(name)
        rows.append((name, old, now, change, allowed, status))
    missing = sorted(set(bf) - set(nf))
    return rows, regressed, missing


def keep_better(doc: dict, again: dict, names) -> None:
    """Each of names in doc["figures"] takes its better value over doc and again (a re-run)."""
    for name in names:
        fig, new = doc["figures"].get(name), again["figures"].get(name)
        if fig is None or new is None:
            continue
        higher = fig.get("higher_is_better", True)
        if (new["value"] > fig["value"]) == higher and new["value"] != fig["value"]:
            fig["value"] = new["value"]
        fig["runs"] = fig.get("runs", 1) + 1


def confirm(doc: dict, base: dict, args, pytest_args: list, tmp: str):
    """Re-run the files of the regressed figures up to args.confirm times, each figure keeping its
    better value, until none is regressed: a slowdown counts only if every run shows it (on a
    shared machine a phase of other load can slow one run's kernels by a third).  Returns
    compare()'s (rows, regressed, missing)."""
    result = compare(base, doc, args.tolerance, args.peer_tolerance)
    for attempt in range(args.confirm):
        regressed = result[1]
        files = sorted({doc["figures"][n].get("file") for n in regressed} - {None})
        if not files:
            break
        print(f"\n{len(regressed)} figure(s) past the tolerance; re-running {', '.join(files)} "
              f"(confirmation {attempt + 1} of {args.confirm})", flush=True)
        again = run_benches(args.quick, pytest_args, os.path.join(tmp, f"again{attempt}.json"),
                            [os.path.join(HERE, f) for f in files])
        keep_better(doc, again, regressed)
        result = compare(base, doc, args.tolerance, args.peer_tolerance)
    return result


def print_table(rows, missing, base_doc, new_doc) -> None:
    print(f"\nbaseline: {base_doc.get('time', '?')}, read bandwidth "
          f"{base_doc.get('read_bandwidth_GBps', 0):.1f} GB/s; this run: read bandwidth "
          f"{new_doc.get('read_bandwidth_GBps', 0):.1f} GB/s; CPU {cpu_key(new_doc['cpu'])}")
    width = max([len(r[0]) for r in rows] + [10])
    print(f"{'figure':<{width}}  {'baseline':>10}  {'now':>10}  {'change':>8}  {'allowed':>7}  "
          f"runs  status")
    for name, old, now, change, allowed, status in rows:
        runs = new_doc["figures"][name].get("runs", 1)
        print(f"{name:<{width}}  {old:>10.4g}  {now:>10.4g}  {change:>+8.1%}  {allowed:>7.0%}  "
              f"{runs:>4}  {status}")
    for name in missing:
        print(f"{name:<{width}}  (not in this run)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["save", "compare"])
    ap.add_argument("--quick", action="store_true", help="the quick subset (pytest -m quick)")
    ap.add_argument("--dir", default=DEFAULT_DIR, help="baseline folder (default benches/baselines)")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="allowed relative loss of bandwidth shares and per-GB/s rates (0.10)")
    ap.add_argument("--peer-tolerance", type=float, default=0.05,
                    help="allowed relative loss of ratios to peers (0.05)")
    ap.add_argument("--confirm", type=int, default=2, metavar="N",
                    help="re-run the files of regressed figures up to N times; a figure regresses "
                         "only if every run is worse than the tolerance (2; 0: one run decides)")
    ap.add_argument("--runs", type=int, default=2, metavar="N",
                    help="save: run the benchmarks N times, each figure keeping its best (2)")
    ap.add_argument("--run", metavar="FILE", help="compare this figures file instead of running")
    ap.add_argument("--baseline", metavar="FILE", help="compare against this file instead of "
                                                       "the CPU's baseline")
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, pytest_args = argv[:i], argv[i + 1:]
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:  # the runs' figures files
        return _run(args, pytest_args, tmp)


def _run(args, pytest_args: list, tmp: str) -> int:
    """main() after parsing: save or compare, the figures files written under tmp."""
    if args.run:
        with open(args.run) as f:
            doc = json.load(f)
    else:
        doc = run_benches(args.quick, pytest_args, os.path.join(tmp, "figures.json"))
    if not doc["figures"]:
        print("the run recorded no figures (nothing selected?)", file=sys.stderr)
        return 2
    path = args.baseline or baseline_path(args.dir, doc["cpu"], args.quick)

    if args.action == "save":
        for i in range(1, 1 if args.run else args.runs):  # the baseline: each figure's best run
            again = run_benches(args.quick, pytest_args, os.path.join(tmp, f"save{i}.json"))
            keep_better(doc, again, list(doc["figures"]))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        print(f"saved {len(doc['figures'])} figures as the baseline {path}")
        return 0

    if not os.path.exists(path):
        have = sorted(os.listdir(args.dir)) if os.path.isdir(args.dir) else []
        print(f"no baseline for this CPU ({os.path.basename(path)}); run "
              f"`python benches/regress.py save{' --quick' if args.quick else ''}` first "
              f"(baselines here: {', '.join(have) or 'none'})", file=sys.stderr)
        return 2
    with open(path) as f:
        base = json.load(f)
    if args.run:  # a file: nothing to re-run
        rows, regressed, missing = compare(base, doc, args.tolerance, args.peer_tolerance)
    else:
        rows, regressed, missing = confirm(doc, base, args, pytest_args, tmp)
    print_table(rows, missing, base, doc)
    if regressed:
        print(f"\n{len(regressed)} figure(s) regressed beyond tolerance:")
        for name in regressed:
            print(f"  {name}")
        return 1
    print(f"\nno regression ({len(rows)} figures compared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
