"""Write gridrun/grid/update_rates.json, the GPU check's update rates that every plan's cost
model reads, from bench/measured/gpu-<class>-<date>.jsonl (bench/gpu.py's rows). Run it after
adding a GPU check's rows there; tests/test_cost.py fails while the two disagree.

    .venv/bin/python scripts/ship_rates.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's cost model, whatever gridrun the venv holds

from gridrun.grid.cost import gpu_check_rates, rates_json


def main() -> None:
    rates = gpu_check_rates(REPO / "bench" / "measured")
    out = REPO / "gridrun" / "grid" / "update_rates.json"
    out.write_text(rates_json(rates))
    for (gpu, arch), rate in sorted(rates.items()):
        print(f"{gpu} {arch}: {rate.value / 1e12:.1f} TFLOP/s ({rate.source})")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
