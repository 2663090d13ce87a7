"""Screenshots of the dashboard on a live growth run's database (into RUN/dashboard/, e.g.
docs/gpu-runs/2026-12-07/live/dashboard/): the Leaks, OOM-risk and post-mortem pages as a user
opens them after the run (the window ending at the newest sample), and Leaks and OOM risk in a
window that ends while the grower was still growing (the ten minutes up to ``--mid-end``, Unix
seconds), to compare what each says.

    python -m tests.gpu.live_growth_screens docs/gpu-runs/2026-12-07/live \\
        --mid-end 1796648025

Needs what ``tools.screenshots`` needs (selenium, chromium, chromedriver)."""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

from tools.screenshots import capture, served_in_browser


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run folder holding growth_oom.db.gz")
    p.add_argument("--mid-end", type=float, required=True, help="the mid-run window's end")
    p.add_argument("--out", type=Path, help="default: RUN/dashboard")
    args = p.parse_args(argv)
    out = args.out or args.run / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "run.db"
        with gzip.open(args.run / "growth_oom.db.gz") as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        mid = f"?device=0&end={args.mid_end:.0f}&span=600"  # the ten minutes before
        pages = [("after-leaks", "/leaks?device=0"), ("after-risk", "/risk?device=0"),
                 ("after-postmortem", "/postmortems/1"), ("mid-leaks", "/leaks" + mid),
                 ("mid-risk", "/risk" + mid)]
        with served_in_browser(f"sqlite:///{db}") as (driver, base_url):
            for path in capture(driver, base_url, out, [1400], pages):
                print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
