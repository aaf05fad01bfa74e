"""The quick-start command on a shared machine: `headcoop report count01` quiet, with one core busy and with two
(each busy core a Python process spinning `while True: pass`), with headcoop's thread settings (the CLI as
shipped: `headcoop.threads.configure_process` before torch starts) against torch's defaults (the same command
with torch imported first, so nothing is configured), side by side in one run.

    python benchmarks/busy_machine.py [--repeats 1] [--json out.json]

The goal (issue 62, item 6): with one of two cores busy, at most 2x the quiet time (half the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"
SHIPPED = "from headcoop.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
DEFAULTS = "import torch; from headcoop.cli import main; import sys; sys.exit(main(sys.argv[1:]))"


def timed(code: str, out: Path) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HEADCOOP_THREADS")}  # fmt: skip
    env["HEADCOOP_PROGRESS"] = "0"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, "report", "count01", "--out", str(out)], check=True, env=env,
                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for busy in (0, 1, 2):
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
            try:
                for name, code in (("headcoop's settings", SHIPPED), ("torch's defaults", DEFAULTS)):
                    seconds = min(timed(code, Path(folder) / f"r{busy}.html") for _ in range(args.repeats))
                    rows.append(dict(busy_cores=busy, settings=name, seconds=seconds))
                    print(f"{busy} busy core(s), {name}: {seconds:.1f} s", flush=True)
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
    quiet = {r["settings"]: r["seconds"] for r in rows if r["busy_cores"] == 0}
    for row in rows:
        row["vs_quiet"] = row["seconds"] / quiet[row["settings"]]
    print("\n| busy cores | settings | seconds | x its quiet time |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['busy_cores']} | {row['settings']} | {row['seconds']:.1f} | {row['vs_quiet']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
