"""Tables people read in a terminal."""

from __future__ import annotations


def format_table(doc: dict) -> str:
    """The comparison table printed by ``kale simulate`` (ratios against HPA when present)."""
    pols = doc["policies"]
    hpa = pols.get("hpa")
    head = f"{'policy':<10} {'acc. lag (sample*s)':>20} {'mean wait s':>11} {'downtime s':>11} {'SLO viol.':>9} " \
           f"{'GPU-h':>9} {'rescales':>8}"
    if hpa:
        head += f" {'lag/HPA':>8} {'down/HPA':>8} {'GPU/HPA':>8}"
    lines = [head, "-" * len(head)]
    for name, m in pols.items():
        row = (f"{name:<10} {m['accumulated_lag']:>20.4g} {m['mean_wait_s']:>11.2f} {m['downtime_s']:>11.0f} "
               f"{m['slo_violation_rate']:>9.2%} {m['gpu_hours']:>9.0f} {m['rescales']:>8d}")
        if hpa:
            def ratio(key):
                return m[key] / hpa[key] if hpa[key] else float("nan")
            row += f" {ratio('accumulated_lag'):>8.3f} {ratio('downtime_s'):>8.3f} {ratio('gpu_hours'):>8.3f}"
        lines.append(row)
    fluid = doc["limits"]["fluid_gpu_hours"]
    lines.append(f"fluid bound (exactly enough fractional workers, free rescales): {fluid:.0f} GPU-h")
    if "kale" in pols and "oracle" in pols:
        k, o = pols["kale"], pols["oracle"]
        lines.append(f"kale / oracle GPU-h: {k['gpu_hours'] / o['gpu_hours']:.3f}; "
                     f"kale / fluid bound: {k['gpu_hours'] / fluid:.3f}")
    return "\n".join(lines)
