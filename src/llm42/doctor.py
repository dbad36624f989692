"""``llm42 doctor``: check, on this device and library build, the premises the determinism contract rests on.

The contract holds because of two facts about the canonical pass that code
cannot prove in general, only measure on a given device, library build
(torch, CUDA, MKL/oneDNN, driver) and model:

1. **Position invariance.** Each canonical-pass op, at the canonical shape
   (R = window x group rows) and the model's real sizes, gives a row the same
   bits wherever the row sits among the R rows and whatever the other rows hold.
2. **Process invariance.** The same canonical pass run in a second process
   gives the same bits.

``run_doctor`` checks both. For premise 1 it puts a probe row first, last, in
the middle and at a few random rows, among zero rows, random rows and copies of
itself, and requires one digest of the probe's result per op: the canonical
policy's ``linear`` (the model's own weights: qkv, o_proj, gate_up, down of
layer 0, and lm_head), ``rms_norm``, the row ops (``add_rms_norm``,
``rope_and_store``, ``swiglu``), ``attention`` (paged, other rows with other
context lengths), ``process_logits`` + ``sample`` (greedy, seeded top-k, seeded
top-p) and the whole canonical pass (forward + sample) with the probe request's
rows placed among other requests. For premise 2 it runs one canonical pass here
and in a fresh Python process and compares SHA-256 digests of logits, tokens,
log-probs and the K/V written. As information only (never a failure) it reports
whether each op gives the probe the same bits at R = 1 as at R, and how much
the fast path drifts with the batch size.

Only the policies' public op interface and ``llm42.sampler.sample`` are used,
so any canonical policy can be checked: ``run_doctor(..., policy=...)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from llm42.defaults import default_canonical_size
from llm42.generator import DVRGenerator
from llm42.inputs import StepInputs
from llm42.kv import KVStore
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.loader import embedded_model_path, load_checkpoint
from llm42.model.weights import Weights
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.policies.base import ReductionPolicy, row_ops
from llm42.runner import ModelRunner, Segment
from llm42.sampler import SamplingRows, sample
from llm42.verify import CanonicalConfig

FILLERS = ("zeros", "random", "copies")
_FILLER_WORDS = {"zeros": "zero rows", "random": "random rows", "copies": "copies of the probe",
                 "dummies": "dummy rows"}
_BLOCK_SIZE = 16  # the generator's default K/V page
_FAST_BATCH_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
_MAX_FAST_M = 64
_ENV_VARS = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "ONEDNN_MAX_CPU_ISA",
             "DNNL_MAX_CPU_ISA", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES")
_MAX_LISTED = 4  # differing placements named per failed check


# -- the report ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One premise checked for one op at one shape.

    ``premise`` is ``"position"`` (the probe row's bits at every placement) or
    ``"process"`` (this process against a second one). ``num_distinct`` counts
    the distinct results the probe got; the premise holds when it is 1.
    ``differing`` names the placements (or, for ``"process"``, the outputs)
    whose bits differ from those at ``reference``, the first placement tried;
    ``error`` says why a check could not run (which fails it).
    """

    premise: str
    op: str
    shape: str
    num_placements: int
    num_distinct: int
    rows: tuple[int, ...] = ()
    fillers: tuple[str, ...] = ()
    reference: str = ""  # the first placement, which the others are compared with
    differing: tuple[str, ...] = ()
    num_differing: int = 0
    error: str = ""

    @property
    def is_ok(self) -> bool:
        return not self.error and self.num_distinct == 1


@dataclass(frozen=True)
class Info:
    """A measured fact, reported for information only (never a failure).

    ``topic`` is ``"n_invariance"`` (the probe alone, R = 1, against the probe
    among R rows; ``num_distinct`` 1 = same bits) or ``"fast_drift"`` (distinct
    results of one row over ``num_tried`` batch sizes on the fast path).
    """

    topic: str
    op: str
    shape: str
    num_distinct: int
    num_tried: int


@dataclass(frozen=True)
class DoctorReport:
    """What ``run_doctor`` found: ``is_ok`` when every premise held; ``failures`` are the checks that broke."""

    config: dict
    environment: dict
    checks: tuple[Check, ...]
    info: tuple[Info, ...]
    seconds: float

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.is_ok)

    @property
    def is_ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        """The full report as JSON-ready data (``llm42 doctor --json``)."""
        return {
            "is_ok": self.is_ok,
            "config": self.config,
            "environment": self.environment,
            "checks": [{**asdict(c), "is_ok": c.is_ok} for c in self.checks],
            "info": [asdict(i) for i in self.info],
            "failures": [f"{c.op} at {c.shape}" for c in self.failures],
            "seconds": self.seconds,
        }

    def format(self) -> str:
        """A readable table (op, shape, placements, result) and a final PASS/FAIL line."""
        cfg, env = self.config, self.environment
        machine = env.get("gpu") or env.get("cpu") or env["device"]
        lines = [
            f"llm42 doctor: {cfg['model']} on {cfg['device']} ({cfg['dtype']}); {machine}; torch {env['torch']}"
            + (f", CUDA {env['cuda']}" if env.get("cuda") else "") + f", llm42 {env['llm42']}, "
            f"{env['threads']} thread(s)" + "".join(f", {k}={v}" for k, v in env["env"].items()),
            f"canonical policy {cfg['policy']}; R = {cfg['window']} x {cfg['group']} = {cfg['num_rows']} rows",
        ]
        position = [c for c in self.checks if c.premise == "position"]
        if position:
            rows = ", ".join(map(str, position[0].rows))
            lines += ["", "premise 1: a row gets the same bits wherever it sits among the R rows and whatever "
                      f"the other rows hold (probe at rows {rows}; among zero rows, random rows, copies)"]
            lines += _table(position)
        process = [c for c in self.checks if c.premise == "process"]
        if process:
            lines += ["", "premise 2: a canonical pass run in a second process gives the same bits"]
            lines += _table(process)
        if self.info:
            lines += ["", "information (not premises; never a failure)"]
            lines += _info_lines(self.info, cfg)
        lines.append("")
        if self.is_ok:
            lines.append(f"PASS: every premise held on {cfg['device']} at R = {cfg['num_rows']} "
                         f"({len(self.checks)} checks, {self.seconds:.1f} s)")
        else:
            names = "; ".join(f"{c.op} at {c.shape}" for c in self.failures)
            lines.append(f"FAIL: {len(self.failures)} of {len(self.checks)} checks broke a premise: {names}")
        return "\n".join(lines)


def _result_text(c: Check) -> str:
    if c.error:
        return f"FAIL: {c.error}"
    if c.is_ok:
        return "ok"
    more = c.num_differing - len(c.differing)
    listed = ", ".join(c.differing) + (f" and {more} more" if more > 0 else "")
    if c.premise == "process":
        return f"FAIL: the second process's {listed} differ"
    return f"FAIL: {c.num_distinct} distinct results: {listed} differ from {c.reference}"


def _table(checks: Sequence[Check]) -> list[str]:
    header = ("op", "shape", "placements", "result")
    body = [(c.op, c.shape, str(c.num_placements), _result_text(c)) for c in checks]
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(3)]
    return [f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in (header, *body)]


def _info_lines(info: Sequence[Info], cfg: dict) -> list[str]:
    lines = []
    n_inv = [i for i in info if i.topic == "n_invariance"]
    if n_inv:
        differ = [i.op for i in n_inv if i.num_distinct > 1]
        lines.append(f"  same bits alone (R = 1) as among R = {cfg['num_rows']} rows: {len(n_inv) - len(differ)} "
                     f"of {len(n_inv)} ops" + (f"; differ: {', '.join(differ)}" if differ else ""))
    drift = [i for i in info if i.topic == "fast_drift"]
    if drift:
        lines.append(f"  fast path ({cfg['fast_policy']}) drift with the batch size:")
        width = max(len(i.op) for i in drift)
        lines += [f"    {i.op:<{width}}  {i.num_distinct} distinct result(s) over {i.num_tried} batch sizes "
                  f"({i.shape})" for i in drift]
    return lines


# -- what is checked ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DoctorModel:
    """The weights under test, with the config they came with and where they were loaded from."""

    weights: Weights
    cfg: ModelConfig
    name: str
    path: Path | None = None


def load_model(path: str | Path | None = None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> DoctorModel:
    """Load a HF checkpoint directory or a GGUF file (``None``: the embedded stories260K model) the way
    the generator does.

    Raises ``CheckpointError`` / ``UnsupportedModelError`` (ValueErrors) naming what is wrong.
    """
    path = embedded_model_path() if path is None else Path(path)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    checkpoint = load_checkpoint(path, dtype=dtype, device=device, with_tokenizer=False)
    return DoctorModel(checkpoint.weights, checkpoint.cfg, path.name, path)


def run_doctor(
    model: DVRGenerator | DoctorModel | str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    window: int | None = None,
    group: int | None = None,
    policy: ReductionPolicy | None = None,
    fast_policy: ReductionPolicy | None = None,
    seed: int = 0,
    num_random_rows: int = 2,
    check_processes: bool = True,
    check_fast_drift: bool = True,
) -> DoctorReport:
    """Check the premises of the determinism contract for ``model`` with ``policy`` at R = window x group.

    ``model``: a ``DVRGenerator`` (its weights, canonical config and policies
    are the defaults), a ``DoctorModel``, a checkpoint path, or ``None`` for
    the embedded model (``device``/``dtype`` apply to paths and ``None``).
    ``window``/``group`` left out: the generator's, else the device's defaults
    (``llm42.defaults``), as a generator built there would use.
    ``policy``: the canonical policy under test (default ``FixedShapePolicy()``
    or the generator's); with ``check_processes`` it must pickle, since the
    second process runs it too. ``num_random_rows``: probe rows drawn at random
    beside the first, middle and last. ``seed`` fixes every probe and filler.
    """
    started = time.perf_counter()
    target, defaults = _resolve(model, device, dtype)
    default_window, default_group = default_canonical_size(target.weights.device)
    canonical = CanonicalConfig(window=defaults.get("window", default_window) if window is None else window,
                                group=defaults.get("group", default_group) if group is None else group)
    policy = policy if policy is not None else defaults.get("policy", FixedShapePolicy())
    fast_policy = fast_policy if fast_policy is not None else defaults.get("fast_policy", FastPolicy())
    if not isinstance(num_random_rows, int) or num_random_rows < 0:
        raise ValueError(f"num_random_rows must be an integer >= 0, got {num_random_rows!r}")
    if check_processes:
        try:
            pickle.dumps(policy)
        except Exception as exc:  # noqa: BLE001 - any pickling error means the same thing here
            raise ValueError(f"policy {policy!r} cannot be pickled into a second process ({exc}); "
                             "pass check_processes=False to skip that premise") from None

    num_rows = canonical.num_rows
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = _probe_rows(num_rows, rng, num_random_rows)
    checks: list[Check] = []
    info: list[Info] = []
    for probe in _op_probes(target, policy, num_rows, gen):
        check, first = _check_positions(probe, num_rows, rows, target.weights.device)
        checks.append(check)
        alone = _probe_result(probe, _copies(probe, 1), 0, target.weights.device)
        info.append(Info("n_invariance", probe.op, f"R = 1 vs R = {num_rows}", 1 + (alone != first), 2))
    checks.append(_check_pass_positions(target, policy, canonical, rng))
    if check_processes:
        checks.append(_check_processes(target, policy, canonical, seed))
    if check_fast_drift:
        info += _fast_drift(target, fast_policy, gen, rng)
    config = {
        "model": target.name, "path": None if target.path is None else str(target.path),
        "device": str(target.weights.device), "dtype": str(target.weights.dtype).removeprefix("torch."),
        "window": canonical.window, "group": canonical.group, "num_rows": num_rows,
        "policy": _describe(policy), "fast_policy": _describe(fast_policy), "seed": seed,
    }
    return DoctorReport(config, environment(target.weights.device), tuple(checks), tuple(info),
                        round(time.perf_counter() - started, 3))


def _describe(policy: ReductionPolicy) -> str:
    text, name = repr(policy), type(policy).__name__
    return text if text.startswith(name) else f"{name} ({text})"  # a subclass that kept its base's repr


def _resolve(model, device, dtype) -> tuple[DoctorModel, dict]:
    if isinstance(model, DVRGenerator):
        defaults = {"window": model.canonical_config.window, "group": model.canonical_config.group,
                    "policy": model.canonical_policy, "fast_policy": model.fast_policy}
        return DoctorModel(model.weights, model.cfg, "generator weights"), defaults
    if isinstance(model, DoctorModel):
        return model, {}
    return load_model(model, device=device, dtype=dtype), {}


def environment(device: torch.device) -> dict:
    """The facts the premises depend on: library versions, the device, threads, relevant env vars."""
    env = {"llm42": _llm42_version(), "torch": torch.__version__, "python": platform.python_version(),
           "platform": platform.platform(), "device": str(device), "threads": torch.get_num_threads(),
           "mkl": torch.backends.mkl.is_available(), "cpu": _cpu_name()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    env["env"] = {k: os.environ[k] for k in _ENV_VARS if k in os.environ}
    return env


def _llm42_version() -> str:
    from llm42 import __version__

    return __version__


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- premise 1, op by op ------------------------------------------------------------------------------
Rows = dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Probe:
    """One op under test. ``row``: the probe's inputs, one row each (no leading row dim);
    ``zeros(n)`` / ``random(n)``: filler inputs for n rows (on the CPU; random draws fresh each call);
    ``run(rows, i)``: the op over all rows (on the device), returning row i's outputs."""

    op: str
    shape: str
    row: Rows
    zeros: Callable[[int], Rows]
    random: Callable[[int], Rows]
    run: Callable[[Rows, int], Sequence[torch.Tensor]]


def _probe_rows(num_rows: int, rng: random.Random, num_random: int) -> tuple[int, ...]:
    picks = {0, num_rows // 2, num_rows - 1}
    picks.update(rng.sample(range(num_rows), min(num_random, num_rows)))
    return tuple(sorted(picks))


def digest(tensors: Sequence[torch.Tensor]) -> str:
    """SHA-256 over the dtypes, shapes and raw bits of ``tensors`` (NaNs and signed zeros included)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _copies(probe: _Probe, num_rows: int) -> Rows:
    return {k: v.expand(num_rows, *v.shape).clone(memory_format=torch.contiguous_format)
            for k, v in probe.row.items()}


def _probe_result(probe: _Probe, rows: Rows, index: int, device: torch.device) -> str:
    for name, value in probe.row.items():
        rows[name][index] = value
    return digest(probe.run({k: v.to(device) for k, v in rows.items()}, index))


def _check_positions(probe: _Probe, num_rows: int, rows: tuple[int, ...],
                     device: torch.device) -> tuple[Check, str]:
    """The probe at each row among each kind of filler; returns the check and the first result's digest."""
    first, seen, differing = None, set(), []
    for index in rows:
        fillers = []  # those among which the probe at this row differs from its first result
        for filler in FILLERS:
            fill = {"zeros": probe.zeros, "random": probe.random}.get(filler)
            result = _probe_result(probe, _copies(probe, num_rows) if fill is None else fill(num_rows),
                                   index, device)
            first = result if first is None else first
            seen.add(result)
            if result != first:
                fillers.append(_FILLER_WORDS[filler])
        if fillers:
            differing.append(f"row {index} among {' / '.join(fillers)}")
    check = Check("position", probe.op, probe.shape, len(rows) * len(FILLERS), len(seen), rows, FILLERS,
                  f"row {rows[0]} among {_FILLER_WORDS[FILLERS[0]]}", tuple(differing[:_MAX_LISTED]), len(differing))
    return check, first


def _op_probes(target: DoctorModel, policy: ReductionPolicy, num_rows: int,
               gen: torch.Generator) -> list[_Probe]:
    w, cfg = target.weights, target.cfg
    lw = w.layers[0]
    ops = row_ops(policy)
    hidden, inter2, eps = cfg.hidden_size, 2 * cfg.intermediate_size, cfg.rms_norm_eps

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(w.dtype)

    def dense(op: str, sizes: dict[str, tuple[int, ...]], run) -> _Probe:
        # float inputs of the given row sizes: zero fillers are zeros, random ones standard normal
        shape = " + ".join(f"[{num_rows}, {', '.join(map(str, size))}]" for size in sizes.values())
        return _Probe(op, shape, {k: randn(*size) for k, size in sizes.items()},
                      lambda n: {k: torch.zeros((n, *size), dtype=w.dtype) for k, size in sizes.items()},
                      lambda n: {k: randn(n, *size) for k, size in sizes.items()}, run)

    def linear(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> _Probe:
        num_out, num_in = weight.shape
        probe = dense(f"linear[{name}]", {"x": (num_in,)},
                      lambda rows, i: (policy.linear(rows["x"], weight, bias)[i],))
        shape = f"{probe.shape} x [{num_out}, {num_in}]^T" + ("" if bias is None else " + bias")
        return dataclasses.replace(probe, shape=shape)

    def add_rms_norm(rows, i):
        out, residual = ops.add_rms_norm(rows["x"], rows["residual"], lw.post_norm, eps)
        return out[i], residual[i]

    probes = [*(linear(*args) for args in w.linears()),
              dense("rms_norm", {"x": (hidden,)}, lambda rows, i: (policy.rms_norm(rows["x"], lw.input_norm, eps)[i],)),
              dense("add_rms_norm", {"x": (hidden,), "residual": (hidden,)}, add_rms_norm),
              _rope_probe(target, ops, num_rows, gen, randn),
              dense("swiglu", {"gate_up": (inter2,)}, lambda rows, i: (ops.swiglu(rows["gate_up"])[i],))]
    max_pos = _num_positions(target)
    for context_len in sorted({min(7, max_pos), min(130, max_pos)}):
        probes.append(_attention_probe(target, policy, num_rows, gen, randn, context_len))
    return probes + _sample_probes(target, policy, num_rows, gen, randn)


def _num_positions(target: DoctorModel) -> int:
    """Positions the model can run here: its context, or fewer where a generator's ``max_model_len`` cut the
    RoPE tables (and so every block table) shorter."""
    return min(target.cfg.max_position_embeddings, target.weights.rope_cos.shape[0])


def _rope_probe(target: DoctorModel, ops, num_rows, gen, randn) -> _Probe:
    """RoPE (+ q/k norm) on q and k, K/V written to a scratch copy of the cache: one slot per row."""
    w, cfg = target.weights, target.cfg
    lw = w.layers[0]
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    max_pos = _num_positions(target)

    def zero_rows(n):
        return {"q": torch.zeros((n, hq, d), dtype=w.dtype), "k": torch.zeros((n, hkv, d), dtype=w.dtype),
                "v": torch.zeros((n, hkv, d), dtype=w.dtype), "position": torch.zeros(n, dtype=torch.int64)}

    def random_rows(n):
        return {"q": randn(n, hq, d), "k": randn(n, hkv, d), "v": randn(n, hkv, d),
                "position": torch.randint(0, max_pos, (n,), generator=gen)}

    def run(rows, i):
        n = rows["q"].shape[0]
        cos = w.rope_cos[rows["position"]].to(w.dtype)
        sin = w.rope_sin[rows["position"]].to(w.dtype)
        k_cache = torch.zeros((n, hkv, d), dtype=w.dtype, device=w.device)
        v_cache = torch.zeros_like(k_cache)
        q = ops.rope_and_store(rows["q"], rows["k"], rows["v"], cos, sin, k_cache, v_cache,
                               torch.arange(n, device=w.device), q_norm=lw.q_norm, k_norm=lw.k_norm,
                               eps=cfg.rms_norm_eps)
        return q[i], k_cache[i], v_cache[i]

    probe = {"q": randn(hq, d), "k": randn(hkv, d), "v": randn(hkv, d),
             "position": torch.tensor((max_pos - 1) * 2 // 3)}
    return _Probe("rope_and_store", f"q [{num_rows}, {hq}, {d}], k/v [{num_rows}, {hkv}, {d}]", probe,
                  zero_rows, random_rows, run)


def _attention_probe(target: DoctorModel, policy, num_rows, gen, randn, context_len: int) -> _Probe:
    """Paged attention over a random K/V cache, laid out as the canonical pass lays it out: every row has its
    own copy of its sequence's block table, and ``table_rows`` names each row's first row with the same table,
    so a tiled kernel puts rows of one sequence in one tile. The probe sees ``context_len`` keys. Half the
    random rows belong to the probe's sequence (its table, positions before and after it: its tile-mates,
    shorter and longer); the others see 1 .. 2 x context_len + 64 keys through random block tables."""
    w, cfg = target.weights, target.cfg
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    max_pos = _num_positions(target)
    max_filler_context = min(max_pos, 2 * context_len + 64)
    width = -(-max_pos // _BLOCK_SIZE)  # block-table width of the canonical pass
    num_blocks = 2 * -(-max_filler_context // _BLOCK_SIZE)
    scratch = num_blocks  # the block dummy rows read
    k_cache = randn((num_blocks + 1) * _BLOCK_SIZE, hkv, d).to(w.device)
    v_cache = randn((num_blocks + 1) * _BLOCK_SIZE, hkv, d).to(w.device)

    def table(context: int) -> torch.Tensor:
        t = torch.full((width,), scratch, dtype=torch.int64)
        num_used = -(-context // _BLOCK_SIZE)
        t[:num_used] = torch.randperm(num_blocks, generator=gen)[:num_used]
        return t

    probe_table = table(context_len)

    def random_rows(n):
        positions = torch.randint(0, max_filler_context, (n,), generator=gen)
        tables = torch.stack([table(int(p) + 1) for p in positions])
        mates = torch.rand(n, generator=gen) < 0.5  # rows of the probe's sequence, before and after it
        tables[mates] = probe_table
        num_probe_keys = -(-context_len // _BLOCK_SIZE) * _BLOCK_SIZE  # positions its table has blocks for
        positions[mates] = torch.randint(0, num_probe_keys, (int(mates.sum()),), generator=gen)
        return {"q": randn(n, hq, d), "position": positions, "table": tables}

    def zero_rows(n):
        return {"q": torch.zeros((n, hq, d), dtype=w.dtype), "position": torch.zeros(n, dtype=torch.int64),
                "table": torch.full((n, width), scratch, dtype=torch.int64)}

    def run(rows, i):
        n = rows["q"].shape[0]
        positions = rows["position"]
        inputs = StepInputs(
            token_ids=torch.zeros(n, dtype=torch.int64, device=w.device), positions=positions,
            slot_mapping=torch.full((n,), scratch * _BLOCK_SIZE, dtype=torch.int64, device=w.device),
            row_seq=torch.arange(n, device=w.device), block_tables=rows["table"], context_lens=positions + 1,
            seq_starts=tuple(range(n + 1)), max_context_len=int(positions.max()) + 1,
            table_rows=_first_equal_rows(rows["table"]),
        )
        out = policy.attention(rows["q"], k_cache, v_cache, inputs, block_size=_BLOCK_SIZE,
                               scale=cfg.head_dim**-0.5, sliding_window=cfg.sliding_window)
        return (out[i],)

    probe = {"q": randn(hq, d), "position": torch.tensor(context_len - 1), "table": probe_table}
    return _Probe(f"attention[context {context_len}]",
                  f"q [{num_rows}, {hq}, {d}], K/V [{hkv}, {d}], others 1..{max_filler_context} keys", probe,
                  zero_rows, random_rows, run)


def _first_equal_rows(tables: torch.Tensor) -> torch.Tensor:
    """[n, width] block tables -> [n]: each row's first row with an equal table (``StepInputs.table_rows``)."""
    _, group = torch.unique(tables, dim=0, return_inverse=True)
    rows = torch.arange(tables.shape[0], device=tables.device)
    first = torch.full((int(group.max()) + 1,), tables.shape[0], dtype=torch.int64, device=tables.device)
    return first.scatter_reduce(0, group, rows, reduce="amin")[group]


def _sample_probes(target: DoctorModel, policy, num_rows, gen, randn) -> list[_Probe]:
    """``process_logits`` then ``sample`` over [R, V] logits: a greedy, a seeded top-k and a seeded top-p row."""
    w, cfg = target.weights, target.cfg
    vocab = cfg.vocab_size

    def zero_rows(n):
        return {"logits": torch.zeros((n, vocab), dtype=w.dtype), "temperature": torch.zeros(n),
                "top_k": torch.zeros(n, dtype=torch.int64), "top_p": torch.ones(n),
                "seed": torch.zeros(n, dtype=torch.int64), "position": torch.zeros(n, dtype=torch.int64)}

    def random_rows(n):
        def pick(*values):
            return torch.tensor(values)[torch.randint(0, len(values), (n,), generator=gen)]

        return {"logits": (3 * randn(n, vocab).float()).to(w.dtype), "temperature": pick(0.0, 0.7, 1.0, 1.3),
                "top_k": pick(0, 1, 5, 50), "top_p": pick(1.0, 0.9, 0.5),
                "seed": torch.randint(0, 1 << 62, (n,), generator=gen),
                "position": torch.randint(1, cfg.max_position_embeddings, (n,), generator=gen)}

    def run(rows, i):
        n = rows["logits"].shape[0]
        positions = (rows["position"] - 1).clamp(min=0)  # the row whose logits sample this position
        device = rows["logits"].device
        inputs = StepInputs(
            token_ids=torch.zeros(n, dtype=torch.int64, device=device), positions=positions,
            slot_mapping=torch.arange(n, device=device), row_seq=torch.arange(n, device=device),
            block_tables=torch.zeros((n, 1), dtype=torch.int64, device=device), context_lens=positions + 1,
            seq_starts=tuple(range(n + 1)), max_context_len=int(positions.max()) + 1,
        )
        logits = policy.process_logits(rows["logits"], inputs)
        temperature = rows["temperature"]
        tokens, logprobs = sample(logits, SamplingRows(
            temperature=temperature, top_k=rows["top_k"], top_p=rows["top_p"], seeds=rows["seed"],
            positions=rows["position"], is_any_sampled=bool((temperature > 0).any()),
        ))
        return tokens[i], logprobs[i]

    probes = []
    for name, temperature, top_k, top_p in (("greedy", 0.0, 0, 1.0), ("top-k", 0.8, 20, 1.0),
                                            ("top-p", 1.0, 0, 0.9)):
        row = {"logits": (3 * randn(vocab).float()).to(w.dtype), "temperature": torch.tensor(temperature),
               "top_k": torch.tensor(top_k), "top_p": torch.tensor(top_p), "seed": torch.tensor(1234),
               "position": torch.tensor(17 % cfg.max_position_embeddings)}
        probes.append(_Probe(f"sample[{name}]", f"[{num_rows}, {vocab}] logits", row, zero_rows, random_rows, run))
    return probes


# -- premise 1 for the whole pass, and premise 2 ------------------------------------------------------
Request = tuple[tuple[int, ...], SamplingParams, int]  # (tokens from position 0, params, seed)


def _random_request(rng: random.Random, cfg: ModelConfig, length: int) -> Request:
    params = SamplingParams(temperature=rng.choice((0.0, 0.7, 1.0)), top_k=rng.choice((0, 5, 50)),
                            top_p=rng.choice((1.0, 0.9)))
    return tuple(rng.randrange(cfg.vocab_size) for _ in range(length)), params, rng.randrange(1 << 62)


def _fill_rows(rng: random.Random, cfg: ModelConfig, num_rows: int, max_len: int) -> list[Request]:
    requests = []
    while num_rows > 0:
        length = min(num_rows, rng.randint(1, max_len))
        requests.append(_random_request(rng, cfg, length))
        num_rows -= length
    return requests


def _prefill_segments(target: DoctorModel, requests: Sequence[Request], *,
                      num_scratch_slots: int) -> tuple[KVStore, list[Segment]]:
    """A fresh K/V store just large enough for ``requests``, each allocated as one prompt chunk from 0."""
    w = target.weights
    kv = KVStore(target.cfg, num_blocks=sum(-(-len(t) // _BLOCK_SIZE) for t, _, _ in requests) + 1,
                 block_size=_BLOCK_SIZE, num_scratch_slots=num_scratch_slots, dtype=w.dtype, device=w.device,
                 enable_prefix_cache=False)
    segments = []
    for rid, (tokens, params, seed) in enumerate(requests):
        kv.allocate(rid, len(tokens))
        kv.append(rid, len(tokens))
        segments.append(Segment(rid, tokens, 0, params, seed))
    return kv, segments


def run_canonical_pass(target: DoctorModel, policy: ReductionPolicy, num_rows: int,
                       requests: Sequence[Request]) -> dict[str, torch.Tensor]:
    """One canonical pass over ``requests`` (each a prompt chunk from position 0), as the verifier runs it.

    Returns the pass's ``logits`` [R, V], sampled ``tokens`` [R] and ``logprobs`` [R], and ``kv``: the K
    and V every request wrote, [2, layers, tokens, Hkv, D] in request order.
    """
    w, cfg = target.weights, target.cfg
    kv, segments = _prefill_segments(target, requests, num_scratch_slots=num_rows)
    runner = ModelRunner(w, cfg)
    inputs = runner.canonical_inputs(segments, kv, num_rows)
    logits = forward(w, cfg, inputs, kv.layers(), policy)
    per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
    tokens, logprobs = sample(logits, runner.sampling_rows(per_row, num_rows))
    slots = torch.tensor([slot for s in segments for slot in kv.slots(s.rid, 0, s.end)], device=w.device)
    layers = kv.layers()
    written = torch.stack([torch.stack([k[slots] for k in layers.k]), torch.stack([v[slots] for v in layers.v])])
    return {"logits": logits, "tokens": tokens, "logprobs": logprobs, "kv": written}


def _check_pass_positions(target: DoctorModel, policy: ReductionPolicy, canonical: CanonicalConfig,
                          rng: random.Random) -> Check:
    """A probe request's window of rows first, in the middle and last of a canonical pass, among dummy
    rows, random requests and copies of itself: its logits, tokens, log-probs and K/V must not change."""
    cfg, num_rows = target.cfg, canonical.num_rows
    # at most half the rows, so that the probe has somewhere to move even when R = T
    max_len = min(canonical.window, max(1, num_rows // 2), cfg.max_position_embeddings)
    probe = _random_request(rng, cfg, max_len)
    probe = (probe[0], SamplingParams(temperature=0.8, top_k=40, top_p=0.95), probe[2])
    num_free = num_rows - max_len
    placements = [("first", "dummies")]
    if num_free:
        placements += [("first", "random"), ("middle", "random"), ("last", "random"),
                       ("first", "copies"), ("last", "copies")]
    first, seen, differing = None, set(), []
    for where, filler in placements:
        if filler == "random":
            others = _fill_rows(rng, cfg, num_free, min(canonical.window, cfg.max_position_embeddings))
        elif filler == "copies":
            others = [probe] * (num_free // max_len)
            if num_free % max_len:
                others.append((probe[0][: num_free % max_len], probe[1], probe[2]))
        else:
            others = []
        split = {"first": 0, "middle": len(others) // 2, "last": len(others)}[where]
        requests = others[:split] + [probe] + others[split:]
        out = run_canonical_pass(target, policy, num_rows, requests)
        start = sum(len(t) for t, _, _ in requests[:split])
        rows = slice(start, start + max_len)
        result = digest([out["logits"][rows], out["tokens"][rows], out["logprobs"][rows],
                         out["kv"][:, :, start: start + max_len]])
        first = result if first is None else first
        seen.add(result)
        if result != first:
            differing.append(f"rows {start}..{start + max_len - 1} among {_FILLER_WORDS[filler]}")
    return Check("position", "canonical pass", f"forward + sample, {max_len} of {num_rows} rows",
                 len(placements), len(seen), (), tuple(f for _, f in placements),
                 f"rows 0..{max_len - 1} among dummy rows", tuple(differing[:_MAX_LISTED]), len(differing))


def pass_digests(target: DoctorModel, policy: ReductionPolicy, canonical: CanonicalConfig,
                 seed: int) -> dict[str, str]:
    """Digests of a full canonical pass over seeded random requests (what each process of premise 2 runs)."""
    rng = random.Random(seed)
    max_len = min(canonical.window, target.cfg.max_position_embeddings)
    requests = _fill_rows(rng, target.cfg, canonical.num_rows, max_len)
    out = run_canonical_pass(target, policy, canonical.num_rows, requests)
    return {name: digest([t]) for name, t in out.items()}


def _check_processes(target: DoctorModel, policy: ReductionPolicy, canonical: CanonicalConfig,
                     seed: int, timeout_s: float = 900.0) -> Check:
    shape = f"forward + sample, {canonical.num_rows} rows"
    here = pass_digests(target, policy, canonical, seed)
    with tempfile.TemporaryDirectory(prefix="llm42-doctor-") as tmp:
        spec = Path(tmp) / "spec.pt"
        weights = None if target.path is not None else target.weights
        torch.save({"path": None if target.path is None else str(target.path), "weights": weights,
                    "cfg": target.cfg, "name": target.name, "device": str(target.weights.device),
                    "dtype": target.weights.dtype, "policy": policy, "window": canonical.window,
                    "group": canonical.group, "seed": seed, "threads": torch.get_num_threads()}, spec)
        # the child imports exactly what this process imports (a source checkout, a test module's policy)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-c", "from llm42.doctor import _second_process; _second_process()", str(spec)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Check("process", "canonical pass", shape, 2, 0,
                         error=f"the second process ran past {timeout_s:.0f} s")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Check("process", "canonical pass", shape, 2, 0,
                     error=f"the second process failed (exit {proc.returncode}): {tail}")
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    differing = tuple(name for name in here if here[name] != there.get(name))
    return Check("process", "canonical pass", shape, 2, 1 + bool(differing),
                 differing=differing, num_differing=len(differing))


def _second_process() -> None:
    """Entry point of premise 2's second process: reads the spec file, prints the pass's digests as JSON."""
    spec = torch.load(sys.argv[1], weights_only=False)
    torch.set_num_threads(spec["threads"])
    if spec["weights"] is None:
        target = load_model(spec["path"], device=spec["device"], dtype=spec["dtype"])
    else:
        target = DoctorModel(spec["weights"], spec["cfg"], spec["name"])
    canonical = CanonicalConfig(window=spec["window"], group=spec["group"])
    print(json.dumps(pass_digests(target, spec["policy"], canonical, spec["seed"])))


# -- information: fast-path drift ---------------------------------------------------------------------
def _fast_drift(target: DoctorModel, fast_policy: ReductionPolicy, gen: torch.Generator,
                rng: random.Random) -> list[Info]:
    """Distinct results one row gets on the fast path across batch sizes (the drift DVR repairs)."""
    w, cfg = target.weights, target.cfg
    info = []
    for name, weight, bias in w.linears():
        num_out, num_in = weight.shape
        x = torch.randn((_MAX_FAST_M, num_in), generator=gen).to(w.dtype).to(w.device)
        seen = {digest([fast_policy.linear(x[:m], weight, bias)[0]]) for m in range(1, _MAX_FAST_M + 1)}
        info.append(Info("fast_drift", f"linear[{name}]", f"[M, {num_in}] x [{num_out}, {num_in}]^T, "
                         f"M = 1..{_MAX_FAST_M}", len(seen), _MAX_FAST_M))
    probe = _random_request(rng, cfg, min(8, cfg.max_position_embeddings))
    max_len = min(16, cfg.max_position_embeddings)
    runner = ModelRunner(w, cfg)
    seen = set()
    for batch_size in _FAST_BATCH_SIZES:
        requests = [probe] + [_random_request(rng, cfg, rng.randint(1, max_len)) for _ in range(batch_size - 1)]
        kv, segments = _prefill_segments(target, requests, num_scratch_slots=1)
        logits = forward(w, cfg, runner.fast_inputs(segments, kv), kv.layers(), fast_policy)
        seen.add(digest([logits[0]]))
    info.append(Info("fast_drift", "forward", f"logits of one {len(probe[0])}-token prompt in batches of "
                     f"{_FAST_BATCH_SIZES[0]}..{_FAST_BATCH_SIZES[-1]} prompts", len(seen), len(_FAST_BATCH_SIZES)))
    return info
