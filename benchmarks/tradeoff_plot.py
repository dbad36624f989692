"""Issue 10's two SmolLM2 targets side by side, per configuration: offline dvr@50 (x nondet, >= 0.80 asked) against
online free requests' ITL p50 and p99 over nondet at dvr@50 (<= 1.15x asked), read from the device calls' JSON.

    python3 benchmarks/tradeoff_plot.py [--out benchmarks/results/h100_round43/tradeoff]
    python3 benchmarks/tradeoff_plot.py --json CALL.json --out DIR/tradeoff [--title "..."]

``--json``: every variant of one ``dvr_ab.py`` call that served both (round 44: offline dvr@50 and online dvr@50
in ABBA repeats, one process), each point with every online repeat, instead of ``SOURCES``' files.

Writes ``<out>.json`` (each point with the files it came from) and ``<out>.png`` (the points, the target corner
shaded). Each configuration's two figures come from runs on H100s of rounds 42-43, one process each, mostly one run
(``SOURCES`` names each file; a run that is not in a JSON is not plotted): a picture of the trade, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
R42, R43 = "benchmarks/results/h100_round42", "benchmarks/results/h100_round43"
# label -> (variant in the offline JSON, offline JSON, variant in the online JSON, online JSON)
SOURCES = {
    "default": ("default", f"{R43}/call_b/dvr_ab_smollm2_r43_b.json", "default",
                f"{R43}/call_b/dvr_ab_smollm2_r43_b.json"),
    "canonical_sms=32": ("sms_32", f"{R42}/call_d/dvr_ab_smollm2_r42_d.json", "sms_32",
                         f"{R43}/call_e/dvr_ab_smollm2_r42_e.json"),
    "canonical_sms=32, max_rows=1024": ("sms_32_rows_1024", f"{R43}/call_f/dvr_ab_smollm2_r43_f.json",
                                        "sms_32_rows_1024", f"{R43}/call_e/dvr_ab_smollm2_r42_e.json"),
    "order=budget": ("order_budget", f"{R43}/call_d/dvr_ab_smollm2_r43_d.json", "order_budget",
                     f"{R43}/call_d/dvr_ab_smollm2_r43_d.json"),
    "order=budget, canonical_sms=48": ("order_budget_sms_48", f"{R43}/call_b/dvr_ab_smollm2_r43_b.json",
                                       "order_budget_sms_48", f"{R43}/call_b/dvr_ab_smollm2_r43_b.json"),
    "order=budget, canonical_sms=32, max_rows=1024": (
        "order_budget_sms_32_rows_1024", f"{R43}/call_d/dvr_ab_smollm2_r43_d.json", "order_budget_sms_32_rows_1024",
        f"{R43}/call_d/dvr_ab_smollm2_r43_d.json"),
}
TARGET_OFFLINE, TARGET_ONLINE = 0.80, 1.15


def _online_runs(entry) -> list[dict]:
    """A variant's online dvr@50 runs (one dict, or a list of repeats)."""
    return entry if isinstance(entry, list) else [entry]


def point(label: str, sources: tuple[str, str, str, str], repo: Path = REPO) -> dict | None:
    """One configuration's figures from its files, or None where a run is missing."""
    offline_variant, offline_file, online_variant, online_file = sources
    offline = json.loads((repo / offline_file).read_text())["runs"].get(offline_variant, {}).get("dvr@50")
    online = json.loads((repo / online_file).read_text()).get("online", {})
    # every repeat where the call kept them (``repeats``), else the first one's (``runs``)
    online = (online.get("repeats") or online.get("runs") or {}).get(online_variant, {}).get("dvr@50")
    if offline is None or online is None:
        return None
    ratios = [run["free_itl_over_nondet"] for run in _online_runs(online) if run.get("free_itl_over_nondet")]
    if not ratios:
        return None
    return {"label": label, "offline_dvr50": offline["ratio_to_nondet"],
            "online_p50": [r["p50"] for r in ratios], "online_p99": [r["p99"] for r in ratios],
            "meets_both": (offline["ratio_to_nondet"] >= TARGET_OFFLINE
                           and all(r["p50"] <= TARGET_ONLINE and r["p99"] <= TARGET_ONLINE for r in ratios)),
            "offline_file": offline_file, "online_file": online_file}


def one_call(path: Path, repo: Path = REPO) -> dict[str, tuple[str, str, str, str]]:
    """``SOURCES`` for one call's JSON: each variant it ran offline, its label the variant's name."""
    path = path if path.is_absolute() else repo / path
    name = str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)
    return {v: (v, name, v, name) for v in json.loads(path.read_text())["runs"]}


def main(argv: list[str] | None = None, *, repo: Path = REPO) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=repo / R43 / "tradeoff")
    p.add_argument("--json", type=Path, default=None, help="one dvr_ab.py call's JSON: each of its variants")
    p.add_argument("--title", default="SmolLM2 on H100s, rounds 42-43")
    args = p.parse_args(argv)
    sources = SOURCES if args.json is None else one_call(args.json, repo)
    points = [pt for label, src in sources.items() if (pt := point(label, src, repo)) is not None]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"target_offline_dvr50": TARGET_OFFLINE,
                                                         "target_online_itl": TARGET_ONLINE, "points": points},
                                                        indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.fill_between([1.0, TARGET_ONLINE], TARGET_OFFLINE, 1.0, color="tab:green", alpha=0.12, label="both targets")
    for pt in points:
        for p50, p99 in zip(pt["online_p50"], pt["online_p99"]):
            ax.plot([p50, p99], [pt["offline_dvr50"]] * 2, color="0.7", linewidth=1)
            ax.scatter([p50], [pt["offline_dvr50"]], zorder=3)
        ax.annotate(pt["label"], (pt["online_p50"][0], pt["offline_dvr50"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("online free ITL over nondet at dvr@50 (dot p50, line to p99)")
    ax.set_ylabel("offline dvr@50 throughput (x nondet)")
    met = [pt["label"] for pt in points if pt["meets_both"]]
    ax.set_title(f"{args.title}:\n" + (f"both targets met by {', '.join(met)}" if met
                                                       else "no configuration in the target corner"), fontsize=10)
    ax.set_xlim(1.0, 1.6)
    ax.set_ylim(0.55, 0.9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    print(f"tradeoff: {len(points)} configurations -> {args.out.with_suffix('.json')}, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
