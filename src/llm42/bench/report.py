"""Markdown tables from a results dict (printed by ``benchmarks/run_all.py``, pasted into docs)."""

from __future__ import annotations


def _num(value, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def offline_table(results: dict) -> str:
    lines = ["| workload | mode | det. share | output tok/s | vs nondet | rollbacks/req | recompute | "
             "identical to reference |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for workload, entry in (results.get("offline") or {}).items():
        for mode, s in entry["modes"].items():
            det = s.get("determinism")
            identical = f"{det['num_identical']}/{det['num_checked']}" if det else "–"
            if mode == "no_batching":
                identical = "(reference)"
            lines.append(
                f"| {workload} | {mode}{'' if s['is_complete'] else ' (cut)'} | {100 * s['deterministic_share']:.0f}% "
                f"| {s['output_tokens_per_s']:.1f} | {_num(s['ratio_to_nondet'])} | {s['rollbacks_per_request']:.2f} "
                f"| {100 * s['recompute_share']:.1f}% | {identical} |"
            )
    return "\n".join(lines)


def online_table(results: dict) -> str:
    lines = ["| load (req/s) | mode | TTFT p50 / p90 / p99 (s) | e2e p50 / p90 / p99 (s) | "
             "non-det. requests' e2e p50 vs nondet |",
             "| --- | --- | --- | --- | ---: |"]
    for entry in (results.get("online") or {}).values():
        for mode, s in entry["modes"].items():
            ttft, e2e = s["latency"]["ttft_s"], s["latency"]["e2e_s"]
            versus = (s.get("nondet_requests_vs_nondet_run") or {}).get("e2e_p50_ratio")
            lines.append(
                f"| {entry['load']} ({entry['rate_rps']:.2f}) | {mode}{'' if s['is_complete'] else ' (cut)'} "
                f"| {_num(ttft['p50'], '{:.3f}')} / {_num(ttft['p90'], '{:.3f}')} / {_num(ttft['p99'], '{:.3f}')} "
                f"| {_num(e2e['p50'], '{:.3f}')} / {_num(e2e['p90'], '{:.3f}')} / {_num(e2e['p99'], '{:.3f}')} "
                f"| {'–' if mode == 'nondet' else _num(versus)} |"
            )
    return "\n".join(lines)


def sweep_table(results: dict) -> str:
    sweep = results.get("sweep") or {}
    lines = ["| T | G | R = T·G | output tok/s | vs nondet | rollbacks/req | recompute |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in sweep.get("points") or []:
        lines.append(f"| {p['window']} | {p['group']} | {p['rows']} | {p['output_tokens_per_s']:.1f} "
                     f"| {_num(p['ratio_to_nondet'])} | {p['rollbacks_per_request']:.2f} "
                     f"| {100 * p['recompute_share']:.1f}% |")
    return "\n".join(lines)


def checks_lines(results: dict) -> str:
    checks = results.get("checks") or {}
    lines = []
    det = checks.get("determinism")
    if det:
        lines.append(f"- determinism: {det['num_identical']}/{det['num_checked']} deterministic dvr@p outputs "
                     f"bit-identical to the {det['reference']} reference")
    bi = checks.get("batch_invariance")
    if bi:
        lines.append(f"- batch invariance: {bi['num_identical']}/{bi['num_checked']} {bi['workload']} requests "
                     "re-run alone through BatchInvariantPolicy equal their batched batch_invariant outputs")
    for label in results.get("skipped") or []:
        lines.append(f"- skipped (time budget): {label}")
    for label, error in (results.get("errors") or {}).items():
        lines.append(f"- FAILED: {label}: {error}")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    meta = results["meta"]
    parts = [f"**{results['label']}**", "",
             f"device {meta['device']['name']}, model {meta['model']['name']} "
             f"({meta['model']['num_params']:,} parameters), T={meta['window']}, G={meta['group']}, "
             f"scale {meta['scale']['name']}, commit {(meta['git']['commit'] or 'unknown')[:10]}, "
             f"{meta['elapsed_s']:.0f} s in all"]
    if results.get("offline"):
        parts += ["", "Offline:", "", offline_table(results)]
    if results.get("online"):
        parts += ["", "Online (ShareGPT-like, Poisson arrivals):", "", online_table(results)]
    if (results.get("sweep") or {}).get("points"):
        parts += ["", f"Window x group sweep ({results['sweep']['mode']}):", "", sweep_table(results)]
    checks = checks_lines(results)
    if checks:
        parts += ["", checks]
    return "\n".join(parts)
