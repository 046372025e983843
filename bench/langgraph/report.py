"""Helpers for scripts/bench-side-by-side.

Usage:
  report.py bytes STATE_DIR   bytes on disk of a state directory
  report.py table WORK_DIR    the side-by-side table of a run

`bytes` first folds each SQLite database's write-ahead log into the database
(`PRAGMA wal_checkpoint(TRUNCATE)`, what SQLite does anyway when the last
connection closes), so both sides are measured in the same settled state,
then sums the sizes of every file under the directory.

WORK_DIR holds, for SIDE in keel and langgraph: SIDE-latency.json,
SIDE-load.json and SIDE-recover.json (each side's own report), SIDE-*.rss
(peak RSS in KiB, read from /proc/<pid>/status VmHWM by the script),
SIDE-*.wall (the process's wall time in seconds), SIDE-load.bytes (bytes on
disk after the load phase) and params.json.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path


def read(work: Path, name: str):
    path = work / name
    if not path.exists():
        return None
    text = path.read_text().strip()
    return json.loads(text) if name.endswith(".json") else float(text)


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100 or digits == 0:
        text = f"{value:,.0f}"
    else:
        text = f"{value:,.{digits}f}"
    return f"{text}{unit}"


def ratio(keel: float | None, langgraph: float | None, higher_is_better: bool) -> str:
    if keel is None or langgraph is None or keel <= 0 or langgraph <= 0:
        return "n/a"
    factor = keel / langgraph if higher_is_better else langgraph / keel
    return f"{factor:,.1f}x"


def is_sqlite(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(16) == b"SQLite format 3\0"


def state_bytes(state: Path) -> int:
    for path in sorted(state.rglob("*")):
        if path.is_file() and is_sqlite(path):
            connection = sqlite3.connect(path)
            try:
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                connection.close()
    return sum(path.stat().st_size for path in state.rglob("*") if path.is_file())


def load_after() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def table(work: Path) -> None:
    params = read(work, "params.json")
    sides = {}
    for side in ("keel", "langgraph"):
        latency = read(work, f"{side}-latency.json") or {}
        load = read(work, f"{side}-load.json") or {}
        recover = read(work, f"{side}-recover.json") or {}
        load_bytes = read(work, f"{side}-load.bytes")
        turns_on_disk = load.get("turns", 0) + load.get("warmup_turns", 0)
        sides[side] = {
            "tps": load.get("turns_per_second"),
            "p50": (latency.get("overhead_ms_per_turn") or {}).get("p50"),
            "p99": (latency.get("overhead_ms_per_turn") or {}).get("p99"),
            "load_mean": (load.get("overhead_ms_per_turn") or {}).get("mean"),
            "load_turn_p50": (load.get("turn_ms") or {}).get("p50"),
            "load_turn_p99": (load.get("turn_ms") or {}).get("p99"),
            "rss_load": (read(work, f"{side}-load.rss") or 0) / 1024 or None,
            "rss_one": (read(work, f"{side}-latency.rss") or 0) / 1024 or None,
            "bytes": load_bytes / turns_on_disk if load_bytes and turns_on_disk else None,
            "recover": recover.get("seconds"),
            "recover_wall": read(work, f"{side}-recover.wall"),
            "recovered": f"{recover.get('sessions', 0):,}/{recover.get('recoverable_turns', 0):,}",
        }
    k, g = sides["keel"], sides["langgraph"]
    n, rn = params["sessions"], params["recover_sessions"]
    rows = [
        (f"turns/s, {n:,} concurrent sessions", fmt(k["tps"]), fmt(g["tps"]), ratio(k["tps"], g["tps"], True)),
        ("overhead per turn p50, 1 session", fmt(k["p50"], " ms", 2), fmt(g["p50"], " ms", 2), ratio(k["p50"], g["p50"], False)),
        ("overhead per turn p99, 1 session", fmt(k["p99"], " ms", 2), fmt(g["p99"], " ms", 2), ratio(k["p99"], g["p99"], False)),
        (f"overhead per turn mean, {n:,} sessions", fmt(k["load_mean"], " ms"), fmt(g["load_mean"], " ms"), ratio(k["load_mean"], g["load_mean"], False)),
        (f"turn latency p50 / p99, {n:,} sessions", f"{fmt(k['load_turn_p50'], ' ms')} / {fmt(k['load_turn_p99'], ' ms')}", f"{fmt(g['load_turn_p50'], ' ms')} / {fmt(g['load_turn_p99'], ' ms')}", ratio(k["load_turn_p50"], g["load_turn_p50"], False)),
        (f"peak RSS, {n:,} concurrent sessions", fmt(k["rss_load"], " MiB"), fmt(g["rss_load"], " MiB"), ratio(k["rss_load"], g["rss_load"], False)),
        ("peak RSS, 1 session", fmt(k["rss_one"], " MiB"), fmt(g["rss_one"], " MiB"), ratio(k["rss_one"], g["rss_one"], False)),
        ("bytes on disk per turn", fmt(k["bytes"], " B", 0), fmt(g["bytes"], " B", 0), ratio(k["bytes"], g["bytes"], False)),
        (f"recover {rn:,} sessions (open + load all)", fmt(k["recover"], " s", 2), fmt(g["recover"], " s", 2), ratio(k["recover"], g["recover"], False)),
        ("  same, whole process incl. start-up", fmt(k["recover_wall"], " s", 2), fmt(g["recover_wall"], " s", 2), ratio(k["recover_wall"], g["recover_wall"], False)),
        ("  sessions loaded / turns recoverable", k["recovered"], g["recovered"], ""),
    ]
    print(
        f"Mock provider latency {params['latency_ms']} ms before the first byte of each response; "
        f"{params['turns']} timed turns per session after 1 warm-up turn; overhead p50/p99 over "
        f"{params['latency_turns']} sequential turns of 1 session; LangGraph durability={params['durability']}; "
        f"load average before the run {params['load_before']}, after {load_after()}; "
        "ratio = how many times keel is ahead.\n"
    )
    print("| metric | keel | LangGraph | ratio |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    command, path = sys.argv[1], Path(sys.argv[2])
    if command == "bytes":
        print(state_bytes(path))
    elif command == "table":
        table(path)
    else:
        sys.exit(f"report.py: unknown command {command!r}; use bytes or table")


if __name__ == "__main__":
    main()
