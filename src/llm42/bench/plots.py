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


def _wrapped(title: str, *, max_chars: int) -> str:
    """``title`` broken at " — " or spaces so no line is wider than the figure (about ``max_chars``)."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width=max(max_chars, 20), break_on_hyphens=False)) or title


def _panels(plt, count: int, title: str, *, width: float = 4.6, height: float = 3.4, max_columns: int = 2):
    columns = min(count, max_columns)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows + 0.4), squeeze=False)
    fig.suptitle(_wrapped(title, max_chars=int(11 * width * columns)), fontsize=10)
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


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


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


# -- benchmarks/serving.py -------------------------------------------------------------------------

def plot_serving_throughput(results: dict, path: Path) -> Path | None:
    """Offline output tokens/s by mode, with the roofline bound and transformers' generate as lines."""
    offline = results.get("offline") or {}
    modes = offline.get("modes") or {}
    if not modes:
        return None
    plt = _pyplot()
    fig, (ax,) = _panels(plt, 1, f"Offline throughput by mode — {results['label']}", width=7.0, height=3.8)
    names = list(modes)
    values = [modes[m]["output_tokens_per_s"] for m in names]
    bars = ax.bar(names, values, color=["tab:blue" if m.startswith(("nondet", "dvr")) else "tab:red" for m in names])
    for bar, m in zip(bars, names):
        ratio = modes[m].get("ratio_to_nondet")
        label = f"{ratio:.2f}x" if ratio is not None else ""
        ax.annotate(label + ("" if modes[m]["is_complete"] else " (cut)"), (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    bound = (offline.get("roofline") or {}).get("output_tokens_per_s")
    if bound:
        ax.axhline(bound, linestyle=":", color="tab:gray", label=f"roofline bound ({bound:,.0f})")
    hf = ((results.get("transformers") or {}).get("hf") or {}).get("output_tokens_per_s")
    if hf:
        ax.axhline(hf, linestyle="--", color="tab:green", label=f"transformers generate, B=256 ({hf:,.0f})")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{offline['workload']['num_requests']} requests at t = 0", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    ax.grid(alpha=0.3, axis="y")
    if bound or hf:
        _legend(ax)
    return _save(plt, fig, path)


def _cdf_line(ax, entry: dict | None, **style) -> None:
    if entry:
        ax.plot([v * 1e3 for v in entry["values"]], [q / 100 for q in entry["percentiles"]], **style)


def plot_serving_itl(results: dict, path: Path) -> Path | None:
    """ITL CDFs, free requests (solid) and deterministic ones (dashed), offline and at each online load."""
    panels = []
    offline = results.get("offline") or {}
    if offline.get("modes"):
        panels.append(("offline", offline["modes"]))
    for load, entry in ((results.get("online") or {}).get("loads") or {}).items():
        if entry["modes"]:
            panels.append((f"online, load {load} ({entry['rate_rps']:.1f} req/s)", entry["modes"]))
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, len(panels), f"Inter-token latency CDF, free vs deterministic — {results['label']}",
                        max_columns=2)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    order = list(dict.fromkeys(name for _, modes in panels for name in modes))  # one color per mode everywhere
    for ax, (title, modes) in zip(axes, panels):
        for name, summary in modes.items():
            color = colors[order.index(name) % len(colors)]
            _cdf_line(ax, summary.get("itl_cdf_free"), color=color, label=f"{name} free")
            _cdf_line(ax, summary.get("itl_cdf_deterministic"), color=color, linestyle="--", label=f"{name} det")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("inter-token latency (ms, log)")
        ax.set_ylabel("fraction of gaps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return _save(plt, fig, path)


def plot_serving(results: dict, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [plot_serving_throughput(results, out_dir / f"{name}_throughput.png"),
            plot_serving_itl(results, out_dir / f"{name}_itl_cdf.png")]
    return [p for p in made if p is not None]


# -- benchmarks/paper_figures.py -------------------------------------------------------------------

def _figure_sections(results: dict) -> list[dict]:
    random = results.get("random") or {}
    return [s for s in (results.get("real"), random.get("calibrated"), random.get("worst_case")) if s]


def _section_title(results: dict, section: dict) -> str:
    if section["label"] == "real":
        return f"{section['model']['name']} (real weights)"
    name = (results.get("random") or {}).get("name", "random")
    std = section.get("lm_head_std")
    kind = "calibrated head" if section["label"] == "calibrated" else "worst case, uncalibrated head"
    return f"{name}, {kind}" + (f" (std {std:.3g})" if std is not None else "")


def plot_fig6(results: dict, path: Path) -> Path | None:
    sections = [s for s in _figure_sections(results) if s.get("fig6")]
    if not sections:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, len(sections), f"Fig. 6: consistent spans, fast path batched vs alone — "
                        f"{results['label']}")
    for ax, section in zip(axes, sections):
        fig6 = section["fig6"]
        for key, color in (("first_span", "tab:blue"), ("second_span", "tab:orange")):
            spans = fig6[key]
            values = sorted(s for s in spans["spans"] if s is not None)
            if values:
                ax.step(values, [(i + 1) / spans["num_measured"] for i in range(len(values))], where="post",
                        color=color, label=f"{key.replace('_', ' ')} ({spans['num_diverged']}/"
                                           f"{spans['num_measured']} diverged)")
        ax.set_title(f"{_section_title(results, section)}, batch {fig6['batch']}", fontsize=9)
        ax.set_xlabel(f"tokens matching before a divergence (horizon {fig6['new_tokens']})")
        ax.set_ylabel("fraction of measured requests")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(plt, fig, path)


def plot_fig9(results: dict, path: Path) -> Path | None:
    sections = [s for s in _figure_sections(results) if (s.get("fig9") or {}).get("points")]
    if not sections:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, 2 * len(sections), f"Fig. 9: verification cost and recompute vs window T — "
                        f"{results['label']}")
    for i, section in enumerate(sections):
        points = section["fig9"]["points"]
        left, right = axes[2 * i], axes[2 * i + 1]
        for group in sorted({p["group"] for p in points}):
            line = sorted((p["window"], p) for p in points if p["group"] == group)
            label = "single (G=1)" if group == 1 else f"grouped (G={group})"
            cost = [(w, p["verify_ms_per_committed_token"]) for w, p in line
                    if p["verify_ms_per_committed_token"] is not None]
            if cost:
                left.plot([w for w, _ in cost], [c for _, c in cost], "o-", label=label)
            right.plot([w for w, _ in line], [100 * p["recompute_share"] for _, p in line], "o-", label=label)
        for ax, ylabel in ((left, "verify cost (ms per committed token)"), (right, "recomputed / committed (%)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("window T")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.set_title(_section_title(results, section), fontsize=9)
            ax.grid(alpha=0.3)
            _legend(ax)
    return _save(plt, fig, path)


def plot_fig10(results: dict, path: Path) -> Path | None:
    sections = [s for s in _figure_sections(results) if (s.get("fig10") or {}).get("modes")]
    if not sections:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, len(sections), f"Fig. 10: throughput vs deterministic share — {results['label']}")
    for ax, section in zip(axes, sections):
        modes = section["fig10"]["modes"]
        curve = sorted((_nominal_share(m), s["output_tokens_per_s"]) for m, s in modes.items()
                       if _nominal_share(m) is not None)
        if curve:
            ax.plot([c[0] for c in curve], [c[1] for c in curve], "o-", color="tab:blue", label="llm42 DVR")
        for mode, style, color in (("batch_invariant", "--", "tab:red"), ("no_batching", ":", "tab:gray")):
            if mode in modes:
                ax.axhline(modes[mode]["output_tokens_per_s"], linestyle=style, color=color, label=mode)
        ax.set_title(f"{_section_title(results, section)}, {section['fig10']['workload']['num_requests']} requests",
                     fontsize=9)
        ax.set_xlabel("deterministic share (%)")
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(plt, fig, path)


def plot_calibration(results: dict, path: Path) -> Path | None:
    calibration = (results.get("random") or {}).get("calibration") or {}
    tried = [t for t in calibration.get("tried", []) if t["rate"] is not None]
    if not tried:
        return None
    plt = _pyplot()
    fig, (ax,) = _panels(plt, 1, f"Output-head calibration — {results['label']}", width=5.5)
    key = "lm_head_bias_scale" if "lm_head_bias_scale" in tried[0] else "lm_head_std"  # round 2's JSON searched the std
    tried = sorted(tried, key=lambda t: t[key])
    ax.plot([t[key] for t in tried], [t["rate"] for t in tried], "o-", label="8B shape, measured")
    ax.axhline(calibration["target_rate"], linestyle="--", color="tab:green", label="real model")
    ax.axvline(calibration[f"chosen_{key}"], linestyle=":", color="tab:gray", label="chosen")
    ax.set_xscale("log")
    ax.set_xlabel("logit-bias scale" if key == "lm_head_bias_scale" else "lm_head std")
    ax.set_ylabel(f"flip rate per token ({calibration['calibrate_on']} rows)")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(plt, fig, path)


def plot_figures(results: dict, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [plot_fig6(results, out_dir / f"{name}_fig6.png"), plot_fig9(results, out_dir / f"{name}_fig9.png"),
            plot_fig10(results, out_dir / f"{name}_fig10.png"),
            plot_calibration(results, out_dir / f"{name}_calibration.png")]
    return [p for p in made if p is not None]
