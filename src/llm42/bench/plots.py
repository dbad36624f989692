"""PNG plots drawn from a results dict (so they can be redrawn from a saved JSON).

- ``<name>_throughput.png``: offline output tokens/s against the deterministic
  share, one panel per workload; ``batch_invariant`` and ``no_batching`` as
  horizontal lines.
- ``<name>_sweep.png``: recompute share and throughput ratio against the
  window T, one line per group G.
- ``<name>_latency_cdf.png``: online end-to-end latency CDFs, one panel per load.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(plt, count: int, title: str, *, width: float = 4.6, height: float = 3.4, max_columns: int = 2):
    columns = min(count, max_columns)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.4), squeeze=False)
    fig.suptitle(title, fontsize=10)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _nominal_share(mode: str) -> float | None:
    """0 for nondet, p for dvr@p (the share asked for; small runs round it up to at least one request)."""
    if mode == "nondet":
        return 0.0
    if mode.startswith("dvr@"):
        return float(mode[4:])
    return None


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(results: dict, path: Path) -> Path | None:
    offline = results.get("offline") or {}
    if not offline:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, len(offline), f"Offline throughput vs deterministic share — {results['short_label']}")
    for ax, (name, entry) in zip(axes, offline.items()):
        modes = entry["modes"]
        curve = sorted((_nominal_share(m), s["output_tokens_per_s"], m)
                       for m, s in modes.items() if _nominal_share(m) is not None)
        if curve:
            ax.plot([c[0] for c in curve], [c[1] for c in curve], "o-", color="tab:blue", label="llm42 DVR")
            for x, y, m in curve:
                ax.annotate(m, (x, y), textcoords="offset points", xytext=(0, 5), fontsize=6, ha="center")
        for mode, style, color in (("batch_invariant", "--", "tab:red"), ("no_batching", ":", "tab:gray")):
            if mode in modes:
                ax.axhline(modes[mode]["output_tokens_per_s"], linestyle=style, color=color, label=mode)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("deterministic share asked for (%)")
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_sweep(results: dict, path: Path) -> Path | None:
    sweep = results.get("sweep") or {}
    points = sweep.get("points") or []
    if not points:
        return None
    plt = _pyplot()
    fig, (left, right) = _panels(plt, 2, f"Window x group sweep ({sweep['mode']}, {sweep['workload']['name']}) — "
                                          f"{results['short_label']}", width=5.0)
    for group in sorted({p["group"] for p in points}):
        line = sorted((p["window"], p) for p in points if p["group"] == group)
        windows = [w for w, _ in line]
        left.plot(windows, [100 * p["recompute_share"] for _, p in line], "o-", label=f"G={group}")
        right.plot(windows, [p["ratio_to_nondet"] or 0.0 for _, p in line], "o-", label=f"G={group}")
    for ax, ylabel in ((left, "recomputed / committed tokens (%)"), (right, "throughput / nondet")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("window T (tokens per request per canonical pass)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_latency_cdf(results: dict, path: Path) -> Path | None:
    online = results.get("online") or {}
    if not online:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, len(online), f"Online end-to-end latency CDF — {results['short_label']}",
                        max_columns=3)
    for ax, (name, entry) in zip(axes, online.items()):
        for mode, summary in entry["modes"].items():
            values = sorted(summary.get("e2e_s_values") or [])
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=mode)
        ax.set_title(f"load {entry['load']} ({entry['rate_rps']:.2f} req/s)", fontsize=9)
        ax.set_xlabel("end-to-end latency (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_all(results: dict, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        plot_throughput(results, out_dir / f"{name}_throughput.png"),
        plot_sweep(results, out_dir / f"{name}_sweep.png"),
        plot_latency_cdf(results, out_dir / f"{name}_latency_cdf.png"),
    ]
    return [p for p in made if p is not None]
