"""Tables people read in a terminal."""

from __future__ import annotations


def _label(doc: dict, name: str) -> str:
    return doc.get("labels", {}).get(name, name)


def format_table(doc: dict) -> str:
    """The comparison table printed by ``kale simulate`` (ratios against HPA when present).

    The oracle is printed as "clairvoyant Kale" (Kale's own logic fed the true future and
    curve: a reference, not a bound); the limits follow: the offline optimum (a dynamic
    program over worker counts with the truth) and the fluid bound."""
    pols = doc["policies"]
    hpa = pols.get("hpa")
    width = max([16] + [len(_label(doc, n)) for n in pols])
    head = f"{'policy':<{width}} {'acc. lag (sample*s)':>20} {'mean wait s':>11} {'downtime s':>11} " \
           f"{'SLO viol.':>9} {'GPU-h':>9} {'rescales':>8}"
    if hpa:
        head += f" {'lag/HPA':>8} {'down/HPA':>8} {'GPU/HPA':>8}"
    lines = [head, "-" * len(head)]
    for name, m in pols.items():
        row = (f"{_label(doc, name):<{width}} {m['accumulated_lag']:>20.4g} {m['mean_wait_s']:>11.2f} "
               f"{m['downtime_s']:>11.0f} {m['slo_violation_rate']:>9.2%} {m['gpu_hours']:>9.0f} {m['rescales']:>8d}")
        if hpa:
            def ratio(key):
                return m[key] / hpa[key] if hpa[key] else float("nan")
            row += f" {ratio('accumulated_lag'):>8.3f} {ratio('downtime_s'):>8.3f} {ratio('gpu_hours'):>8.3f}"
        lines.append(row)
    limits = doc["limits"]
    fluid = limits["fluid_gpu_hours"]
    offline = limits.get("offline_optimal_gpu_hours")
    if offline:
        lines.append(f"offline optimum (DP over worker counts per {limits.get('offline_step_s', 300):g}s step, true "
                     f"arrivals and curve, rescale downtime, SLO held): {offline:.0f} GPU-h, "
                     f"{limits.get('offline_optimal_rescales', 0)} rescales")
    priced = limits.get("priced_optimum")
    if priced:
        lines.append(f"priced optimum (GPU-h plus wait_cost {priced['wait_cost']:g} x mean wait x hours, backlog carried, "
                     f"true arrivals and curve, SLO held): {priced['cost_gpu_h']:.0f} GPU-h of cost "
                     f"({priced['gpu_hours']:.0f} GPU-h, {priced['rescales']} rescales; none below "
                     f"{priced['lower_bound_gpu_h']:.0f})")
    lines.append(f"fluid bound (exactly enough fractional workers, free rescales): {fluid:.0f} GPU-h")
    if "kale" in pols:
        k = pols["kale"]
        parts = []
        if "oracle" in pols:
            parts.append(f"kale / clairvoyant Kale GPU-h: {k['gpu_hours'] / pols['oracle']['gpu_hours']:.3f}")
        if offline:
            parts.append(f"kale / offline optimum: {k['gpu_hours'] / offline:.3f}")
        if priced:
            parts.append(f"kale / priced optimum cost: {k['priced_cost_gpu_h'] / priced['cost_gpu_h']:.3f}")
        parts.append(f"kale / fluid bound: {k['gpu_hours'] / fluid:.3f}")
        lines.append("; ".join(parts))
    return "\n".join(lines)
