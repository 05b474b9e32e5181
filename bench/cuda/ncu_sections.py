#!/usr/bin/env python3
"""Summarizes `ncu --page raw --csv` output (decode_device.sh sections): per kernel name, the
launches profiled, mean duration, DRAM throughput (% of peak and GB/s), achieved and
theoretical occupancy, registers a thread, and the three largest stall reasons (warps stalled
per issued instruction, from the WarpStateStats section).

Usage: ncu_sections.py NCU_RAW.csv
"""
import collections
import csv
import re
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def short_name(full):
    """The kernel's name with its template arguments, without its parameter list."""
    for noise in ("void ", "(anonymous namespace)::", "<unnamed>::", "unnamed>::", "nt::cuda::",
                  "detail::", "(nt::GgmlType)"):
        full = full.replace(noise, "")
    depth = 0
    for i, ch in enumerate(full):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            full = full[:i]
            break
    return full[:60]


def main(path):
    with open(path) as f:
        rows = [r for r in csv.reader(f) if len(r) > 5]
    if len(rows) < 3:
        sys.exit(f"{path}: no profiled kernels")
    head, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}

    def get(r, name):
        i = col.get(name)
        return num(r[i]) if i is not None and i < len(r) else None

    scale_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    dur = "gpu__time_duration.sum"
    dur_scale = scale_us.get(units[col[dur]], 1.0) if dur in col else 1.0
    stalls = [(m.group(1), name) for name in col
              if (m := re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio",
                                    name))]
    groups = collections.defaultdict(list)
    for r in data:
        groups[short_name(r[col["Kernel Name"]])].append(r)
    print(f"{'kernel':60} {'grid':>6} {'n':>3} {'us':>7} {'dram%':>6} {'GB/s':>6} {'occ%':>5} {'theo%':>5} "
          f"{'regs':>4}  stalls (warps per issued instruction)")
    for name, rs in sorted(groups.items(), key=lambda kv: -sum(get(r, dur) or 0 for r in kv[1])):
        def mean(metric):
            vals = [v for r in rs if (v := get(r, metric)) is not None]
            return sum(vals) / len(vals) if vals else float("nan")
        us = mean(dur) * dur_scale
        bw = mean("dram__bytes_read.sum.per_second")
        bw_unit = units[col["dram__bytes_read.sum.per_second"]] if "dram__bytes_read.sum.per_second" in col else ""
        gbs = bw * {"byte/s": 1e-9, "byte/second": 1e-9, "Kbyte/second": 1e-6,
                    "Mbyte/second": 1e-3, "Gbyte/second": 1.0, "Tbyte/second": 1e3}.get(bw_unit, float("nan"))
        top = sorted(((mean(metric), reason) for reason, metric in stalls), reverse=True)[:3]
        grid = rs[0][col["Grid Size"]].strip("()").split(",")[0] if "Grid Size" in col else "?"
        print(f"{name:60} {grid:>6} {len(rs):3d} {us:7.1f} "
              f"{mean('gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
              f"{gbs:6.0f} {mean('sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f} "
              f"{mean('sm__maximum_warps_per_active_cycle_pct'):5.1f} "
              f"{mean('launch__registers_per_thread'):4.0f}  "
              + ", ".join(f"{k} {v:.1f}" for v, k in top))


if __name__ == "__main__":
    main(sys.argv[1])
