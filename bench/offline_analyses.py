#!/usr/bin/env python3
"""Offline analyses on a generated dump: msmemscope vs straightforward pandas, in one run.

A C generator (bench/gen_dump.c, built here with gcc) writes a synthetic CSV dump of ROWS rows
(default 10,000,000: a CPU training run with ~1.8M ops, MALLOC/FREE keeping ~300k blocks live,
ACCESS rows, STEP rows and three MSTX marks named "bench"), and for compare a pair of
--compare-rows rows each (default 2,000,000, to keep the default run near 5 minutes on 2
cores): such a dump and a slightly modified copy (the same run with ~10 extra ops and ~10
doubled allocations). Then, each in its own process, timed
(wall clock) and with its peak RSS (`/usr/bin/time -f %M`, or `os.wait4` when missing):

- compare: `msmemscope-cli --compare --input-path=BASE,COPY` (two reader threads) vs pandas
  (read_csv of both, per-op MALLOC sums by cumsum/groupby, then Myers' greedy O(ND) diff in pure
  Python: pandas has no sequence alignment). Both write the compare CSV; the files must match.
- check_leaks: `msmemscope.check_leaks(BASE, "bench", 0)` (the Rust core through PyO3) vs
  pandas (marks by mask, MALLOCs between A and B merged with FREEs before C).
- check_inefficient: `msmemscope.check_inefficient(BASE)` vs pandas (op = cumsum of ATEN_START,
  first/last access by groupby, other frees/mallocs between by searchsorted, idle gaps by
  groupby diff). The pandas versions rely on the generated dump's unique pointers and single
  device; the Rust ones handle any dump.

Result counts are cross-checked; the script prints rows/s, peak RSS and the speed ratio per
analysis (target >= 20x) and writes bench/out/offline_analyses_<ts>.json. Exit status 0 unless
something failed to run or the results disagree.

Requirements: gcc, a release build (`cargo build --release`; the script runs it unless
--no-build), Python 3 with pandas for the baseline: the script re-executes itself under
/work/main/.venv/bin/python when that has pandas. Install it with
`.venv/bin/python -m pip install pandas` (the only extra package; everything else is stdlib).

    python3 bench/offline_analyses.py                   # ~5 min on 2 cores
    python3 bench/offline_analyses.py --rows 2000000    # quicker
    python3 bench/offline_analyses.py --compare-rows 10000000 --skip-pandas
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
TIME = "/usr/bin/time"


# --------------------------------------------------------------------------------------------
# pandas baselines (run in a child process: `offline_analyses.py --worker KIND ARGS...`)
# --------------------------------------------------------------------------------------------


def pandas_op_memory(path):
    import pandas as pd

    df = pd.read_csv(path, usecols=["Event", "Event Type", "Name", "Device Id", "Attr"])
    ev, et = df["Event"], df["Event Type"]
    start = (ev == "OP_LAUNCH") & (et == "ATEN_START")
    end = (ev == "OP_LAUNCH") & (et == "ATEN_END")
    op_no = start.cumsum()
    inside = op_no > end.cumsum()  # after op k's start, before its end (ops do not nest here)
    mal = (ev == "MALLOC") & inside
    sizes = df.loc[mal, "Attr"].str.extract(r'"size":(\d+)', expand=False).astype("int64")
    per_op = sizes.groupby(op_no[mal]).sum()
    ends = op_no[end]
    names = df.loc[end, "Name"].tolist()
    memory = per_op.reindex(ends.values, fill_value=0).tolist()
    device = df.loc[ev == "MALLOC", "Device Id"].iloc[0]
    return names, memory, str(device)


def myers_python(a, b):
    """Myers' greedy O(ND) forward search with a trace; returns the edit list."""
    n, m = len(a), len(b)
    v = {1: 0}
    trace = []
    for d in range(n + m + 1):
        trace.append(dict(v))
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[k - 1] < v[k + 1]):
                x = v[k + 1]
            else:
                x = v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m, d)
    raise AssertionError("unreachable")


def _backtrack(trace, x, y, d):
    edits = []
    for d in range(d, 0, -1):
        v = trace[d]
        k = x - y
        prev_k = k + 1 if (k == -d or (k != d and v[k - 1] < v[k + 1])) else k - 1
        prev_x = v[prev_k]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            edits.append(("=", x, y))
        if x == prev_x:
            edits.append(("+", None, y - 1))
        else:
            edits.append(("-", x - 1, None))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:
        x, y = x - 1, y - 1
        edits.append(("=", x, y))
    edits.reverse()
    # Within a changed region, deletions first (as msmemscope writes them).
    out, i = [], 0
    while i < len(edits):
        if edits[i][0] == "=":
            out.append(edits[i])
            i += 1
            continue
        j = i
        while j < len(edits) and edits[j][0] != "=":
            j += 1
        out.extend(e for e in edits[i:j] if e[0] == "-")
        out.extend(e for e in edits[i:j] if e[0] == "+")
        i = j
    return out


def worker_compare(base, other, out_path):
    names_a, mem_a, dev = pandas_op_memory(base)
    names_b, mem_b, _ = pandas_op_memory(other)
    edits = myers_python(names_a, names_b)
    lines = [
        ",,,Base,Compare\n",
        "Event,Name,Device Id,Allocated Memory(byte),Allocated Memory(byte),Diff Memory(byte)\n",
    ]
    for kind, i, j in edits:
        name = names_a[i] if i is not None else names_b[j]
        ba = mem_a[i] if i is not None else None
        bb = mem_b[j] if j is not None else None
        diff = (bb or 0) - (ba or 0)
        lines.append(
            f"OP_LAUNCH,{name},{dev},{'N/A' if ba is None else ba},"
            f"{'N/A' if bb is None else bb},{diff}\n"
        )
    with open(out_path, "w") as f:
        f.writelines(lines)
    return {"rows": len(edits)}


def worker_leaks(path):
    import pandas as pd

    df = pd.read_csv(path, usecols=["ID", "Event", "Event Type", "Name", "Device Id", "Ptr"])
    marks = df.loc[
        (df["Event"] == "MSTX") & (df["Event Type"] == "Mark") & (df["Name"] == "bench"), "ID"
    ].tolist()
    a, b, c = marks[0:3]
    pools = df["Event Type"].isin(["PTA", "HAL", "HOST"])
    mal = df[(df["Event"] == "MALLOC") & pools & (df["ID"] > a) & (df["ID"] < b)]
    fre = df[(df["Event"] == "FREE") & pools & (df["ID"] > a) & (df["ID"] < c)]
    key = ["Device Id", "Event Type", "Ptr"]
    both = mal.merge(fre[key + ["ID"]], on=key, how="left", suffixes=("", "_free"))
    freed = both.loc[both["ID_free"] > both["ID"], "ID"].unique()
    leaked = mal[~mal["ID"].isin(freed)]
    return {"leaks": int(len(leaked))}


def worker_inefficient(path, idle_threshold=3000):
    import numpy as np
    import pandas as pd

    df = pd.read_csv(path, usecols=["ID", "Event", "Event Type", "Ptr", "Attr"])
    ev, et = df["Event"], df["Event Type"]
    op = ((ev == "OP_LAUNCH") & (et == "ATEN_START")).cumsum()
    df["op"] = op
    mal = df[(ev == "MALLOC") & et.isin(["PTA", "HOST"])]
    fre = df[ev == "FREE"]
    acc = df[ev == "ACCESS"]
    blocks = pd.DataFrame({"ID": mal["ID"].values, "a": mal["op"].values}, index=mal["Ptr"].values)
    g = acc.groupby("Ptr")["op"]
    blocks["f"] = g.min()
    blocks["l"] = g.max()
    blocks["r"] = fre.set_index("Ptr")["op"]
    free_ops = np.sort(fre["op"].values)
    malloc_ops = np.sort(mal["op"].values)
    accessed = blocks["f"].notna()
    early = accessed & (
        np.searchsorted(free_ops, blocks["f"].fillna(0).values, "left")
        - np.searchsorted(free_ops, blocks["a"].values, "right")
        > 0
    )
    late = (
        accessed
        & blocks["r"].notna()
        & (
            np.searchsorted(malloc_ops, blocks["r"].fillna(0).values, "left")
            - np.searchsorted(malloc_ops, blocks["l"].fillna(0).values, "right")
            > 0
        )
    )
    gaps = acc.sort_values("ID").groupby("Ptr")["op"].diff() - 1
    idle_ptrs = acc.loc[gaps > idle_threshold, "Ptr"].unique()
    idle = blocks.index.isin(idle_ptrs)
    return {
        "early_allocation": int(early.sum()),
        "late_deallocation": int(late.sum()),
        "temporary_idleness": int(idle.sum()),
    }


def duckdb_leaks(path):
    """check_leaks in SQL on DuckDB, reading the CSV itself (read_csv_auto): the MALLOCs
    between marks A and B that no FREE before C frees."""
    import duckdb

    con = duckdb.connect()
    con.execute(
        f"""CREATE TEMP VIEW d AS SELECT "ID" AS id, "Event" AS ev, "Event Type" AS et,
            "Name" AS name, "Device Id" AS dev, "Ptr" AS ptr
            FROM read_csv_auto('{path}', header = true, all_varchar = false)"""
    )
    marks = [
        r[0]
        for r in con.execute(
            "SELECT id FROM d WHERE ev = 'MSTX' AND et = 'Mark' AND name = 'bench' ORDER BY id"
        ).fetchall()
    ]
    a, b, c = marks[0:3]
    (leaks,) = con.execute(
        f"""SELECT count(*) FROM d m
            WHERE m.ev = 'MALLOC' AND m.et IN ('PTA', 'HAL', 'HOST') AND m.id > {a} AND m.id < {b}
              AND NOT EXISTS (
                SELECT 1 FROM d f WHERE f.ev = 'FREE' AND f.dev = m.dev AND f.et = m.et
                  AND f.ptr = m.ptr AND f.id > m.id AND f.id < {c})"""
    ).fetchone()
    return {"leaks": int(leaks)}


def duckdb_scan(path):
    """DuckDB reading the CSV and parsing the columns an analysis reads, with one aggregate
    over them: a lower bound of any analysis done on DuckDB over the CSV."""
    import duckdb

    (rows, ops, size) = (
        duckdb.connect()
        .execute(
            f"""SELECT count(*), count(*) FILTER (WHERE "Event" = 'OP_LAUNCH'),
                   sum(CAST(json_extract("Attr", '$.size') AS BIGINT))
            FROM read_csv_auto('{path}', header = true)"""
        )
        .fetchone()
    )
    return {"rows": int(rows), "ops": int(ops), "size": int(size or 0)}


def worker_main(argv):
    kind, *args = argv
    start = time.perf_counter()
    if kind == "duckdb-leaks":
        result = duckdb_leaks(*args)
    elif kind == "duckdb-scan":
        result = duckdb_scan(*args)
    elif kind == "compare":
        result = worker_compare(*args)
    elif kind == "leaks":
        result = worker_leaks(*args)
    elif kind == "inefficient":
        result = worker_inefficient(*args)
    elif kind == "ours-leaks":
        import msmemscope

        with open(os.devnull, "w") as null:
            saved, sys.stdout = sys.stdout, null
            try:
                leaks = msmemscope.check_leaks(args[0], "bench", 0)
            finally:
                sys.stdout = saved
        result = {"leaks": len(leaks)}
    elif kind == "ours-inefficient":
        import msmemscope

        marks = msmemscope.check_inefficient(args[0])
        result = {}
        for m in marks:
            result[m["inefficient_type"]] = result.get(m["inefficient_type"], 0) + 1
    else:
        raise SystemExit(f"unknown worker {kind}")
    result["inner_s"] = time.perf_counter() - start
    print("RESULT " + json.dumps(result))


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


def measure(cmd, env=None):
    """Runs `cmd`; returns (wall s, peak RSS MiB, stdout)."""
    use_time = os.path.exists(TIME)
    full = [TIME, "-f", "MAXRSS %M"] + cmd if use_time else cmd
    start = time.perf_counter()
    proc = subprocess.Popen(
        full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    rss_kb = usage.ru_maxrss
    if use_time:
        for line in stderr.splitlines():
            if line.startswith("MAXRSS "):
                rss_kb = int(line.split()[1])
        stderr = "\n".join(l for l in stderr.splitlines() if not l.startswith("MAXRSS "))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout}\n{stderr}")
    return wall, rss_kb / 1024, stdout


def result_of(stdout):
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"no result in {stdout!r}")


def prepare(tmp, build):
    if build:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    gen = os.path.join(tmp, "gen_dump")
    subprocess.run(["gcc", "-O2", "-o", gen, os.path.join(ROOT, "bench", "gen_dump.c")], check=True)
    # Private copies, so a concurrent cargo build cannot swap them mid-run.
    cli = os.path.join(tmp, "msmemscope-cli")
    shutil.copy2(os.path.join(RELEASE, "msmemscope-cli"), cli)
    pkg = os.path.join(tmp, "py")
    shutil.copytree(os.path.join(ROOT, "python", "msmemscope"), os.path.join(pkg, "msmemscope"))
    native = os.path.join(RELEASE, "lib_native.so")
    if os.path.exists(native):
        shutil.copy2(native, os.path.join(pkg, "msmemscope", "_native.abi3.so"))
    return gen, cli, pkg


def generate(gen, tmp, rows, tag, with_copy):
    base = os.path.join(tmp, f"base_{tag}.csv")
    copy = os.path.join(tmp, f"copy_{tag}.csv")
    out = subprocess.run([gen, str(rows), "0", base], capture_output=True, text=True, check=True)
    written, ops, _, _ = map(int, out.stdout.split())
    if not with_copy:
        return base, None, written, 0, ops, 0, 0
    out = subprocess.run(
        [gen, str(rows), "1", copy, str(ops)], capture_output=True, text=True, check=True
    )
    written2, _, extra, doubled = map(int, out.stdout.split())
    return base, copy, written, written2, ops, extra, doubled


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="rows of the dump (10M)")
    p.add_argument(
        "--compare-rows",
        type=int,
        default=2_000_000,
        help="rows of each dump of the compare pair (2M; 10M takes two more minutes)",
    )
    p.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    p.add_argument("--skip-pandas", action="store_true", help="time msmemscope only")
    p.add_argument("--skip-duckdb", action="store_true", help="no DuckDB baselines")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (dumps, outputs)")
    opts = p.parse_args()

    python = sys.executable
    if not opts.skip_pandas:
        try:
            import pandas  # noqa: F401
        except ImportError:
            # A venv's python is a link to the base interpreter: tell them apart by prefix.
            in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(ROOT, ".venv"))
            if os.path.exists(VENV_PY) and not in_venv:
                os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
            raise SystemExit("pandas is missing: .venv/bin/python -m pip install pandas")

    tmp = tempfile.mkdtemp(prefix="msmemscope-offline-")
    report = {"rows": opts.rows, "nproc": os.cpu_count(), "analyses": {}}
    failed = False
    try:
        gen, cli, pkg = prepare(tmp, not opts.no_build)
        env = dict(os.environ, PYTHONPATH=pkg)
        env.pop("LD_PRELOAD", None)
        t = time.perf_counter()
        base, _, rows, _, ops, _, _ = generate(gen, tmp, opts.rows, "main", False)
        print(
            f"generated the dump: {rows:,} rows, {ops:,} ops, "
            f"{os.path.getsize(base) / 2**20:,.0f} MiB in {time.perf_counter() - t:.1f} s",
            flush=True,
        )
        t = time.perf_counter()
        cbase, ccopy, crows, crows2, cops, extra, doubled = generate(
            gen, tmp, opts.compare_rows, "cmp", True
        )
        print(
            f"generated the compare pair: {crows:,} + {crows2:,} rows, {cops:,} ops (the copy: "
            f"{extra} extra ops, {doubled} doubled allocations) in {time.perf_counter() - t:.1f} s",
            flush=True,
        )
        me = os.path.abspath(__file__)

        runs = []
        # compare
        ours_out = os.path.join(tmp, "ours")
        wall, rss, stdout = measure(
            [cli, "--compare", f"--input-path={cbase},{ccopy}", "-o", ours_out], env
        )
        ours_file = stdout.strip()
        runs.append(("compare", crows + crows2, wall, rss, None))
        pandas_cmp = None
        if not opts.skip_pandas:
            pandas_file = os.path.join(tmp, "pandas_compare.csv")
            pw, prss, pout = measure([python, me, "--worker", "compare", cbase, ccopy, pandas_file])
            same = open(ours_file).read() == open(pandas_file).read()
            pandas_cmp = (pw, prss, {"identical_output": same})
            failed |= not same
        runs[-1] = runs[-1][:4] + (pandas_cmp,)
        print(f"compare: {wall:.1f} s", flush=True)

        # check_leaks and check_inefficient through the Python API
        ours_results = {}
        for kind in ("leaks", "inefficient"):
            wall, rss, stdout = measure([python, me, "--worker", f"ours-{kind}", base], env)
            ours = result_of(stdout)
            ours_results[f"check_{kind}"] = ours
            pandas_run = None
            if not opts.skip_pandas:
                pw, prss, pout = measure([python, me, "--worker", kind, base])
                theirs = result_of(pout)
                agree = all(ours.get(k, 0) == v for k, v in theirs.items() if k != "inner_s")
                failed |= not agree
                pandas_run = (pw, prss, dict(theirs, ours=ours, agree=agree))
            runs.append((f"check_{kind}", rows, wall, rss, pandas_run))
            print(f"check_{kind}: {wall:.1f} s {ours}", flush=True)

        duck = {}
        if not opts.skip_duckdb:
            try:
                import duckdb  # noqa: F401

                have_duckdb = True
            except ImportError:
                have_duckdb = False
                print("duckdb is missing: DuckDB baselines skipped")
            if have_duckdb:
                dw, drss, dout = measure([python, me, "--worker", "duckdb-leaks", base])
                theirs = result_of(dout)
                duck["check_leaks"] = (dw, drss, "SQL", theirs)
                sw, srss, sout = measure([python, me, "--worker", "duckdb-scan", base])
                duck["scan"] = (sw, srss, "read + one aggregate", result_of(sout))
                print(f"duckdb: check_leaks {dw:.1f} s {theirs}, scan {sw:.1f} s", flush=True)

        print()
        print(
            f"{'analysis':<18}{'rows':>12}{'ours s':>9}{'rows/s':>12}{'RSS MiB':>9}"
            f"{'pandas s':>10}{'rows/s':>12}{'RSS MiB':>9}{'ratio':>8}  check"
        )
        for name, nrows, wall, rss, pandas_run in runs:
            entry = {
                "rows": nrows,
                "ours_s": wall,
                "ours_rows_per_s": nrows / wall,
                "ours_rss_mib": rss,
            }
            line = f"{name:<18}{nrows:>12,}{wall:>9.2f}{nrows / wall:>12,.0f}{rss:>9.0f}"
            if pandas_run:
                pw, prss, info = pandas_run
                entry.update(
                    pandas_s=pw,
                    pandas_rows_per_s=nrows / pw,
                    pandas_rss_mib=prss,
                    ratio=pw / wall,
                    check=info,
                )
                verdict = (
                    "identical" if info.get("identical_output", info.get("agree")) else "DIFFER"
                )
                line += f"{pw:>10.2f}{nrows / pw:>12,.0f}{prss:>9.0f}{pw / wall:>7.1f}x  {verdict}"
            print(line)
            report["analyses"][name] = entry
        if duck:
            print("\nDuckDB reading the CSV directly (read_csv_auto), same dump:")
            for name, (dw, drss, what, info) in duck.items():
                line = (
                    f"  {name:<16}{dw:>8.2f} s{rows / dw:>12,.0f} rows/s{drss:>7.0f} MiB  ({what})"
                )
                ours = report["analyses"].get(name)
                if ours:
                    line += f"  ours {dw / ours['ours_s']:.1f}x faster"
                    agree = ours_results[name].get("leaks") == info.get("leaks")
                    line += ", same leaks" if agree else ", LEAKS DIFFER"
                    failed |= not agree
                print(line)
                report.setdefault("duckdb", {})[name] = {
                    "seconds": dw,
                    "rows_per_s": rows / dw,
                    "rss_mib": drss,
                    "what": what,
                    "result": info,
                }
        print("\ntarget: ratio >= 20x; RSS of ours grows with live blocks / op count, not rows")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        path = os.path.join(
            ROOT, "bench", "out", f"offline_analyses_{time.strftime('%Y%m%d%H%M%S')}.json"
        )
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {path}")
    finally:
        if opts.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
