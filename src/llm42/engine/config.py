"""EngineConfig: every engine knob in one frozen value, validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from llm42.model.config import ModelConfig


def positive_int(owner: str, name: str, value: object) -> int:
    """The one positive-integer check: bools are not integers here."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner} {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{owner} {name} must be a positive integer, got {value!r}")
    return value


def strict_bool(owner: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner} {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


# the tiled canonical attention's tile heights (M-rows per program) a canonical config may name: each is its own
# canonical config (``FixedShapePolicy(tile_m=)``, ``llm42.kernels.tiled_attention``)
CANONICAL_TILE_HEIGHTS = (64, 128)

# which canonical passes the engine launches behind a pass still in flight (``EngineConfig.chain_passes``)
CHAIN_MODES = ("off", "prompts", "all")
CANONICAL_PRIORITIES = ("low", "prompts", "high")


def check_tile_m(owner: str, name: str, tile_m: object) -> int:
    """A canonical tile height: one of ``CANONICAL_TILE_HEIGHTS`` (bools are not integers here)."""
    if isinstance(tile_m, bool) or not isinstance(tile_m, int) or tile_m not in CANONICAL_TILE_HEIGHTS:
        raise ValueError(f"{owner} {name} must be one of {CANONICAL_TILE_HEIGHTS}, got {tile_m!r}")
    return tile_m


# hidden sizes from which a padding row of a fast step costs enough GEMM FLOPs to pay for a finer bucket ladder
COMPUTE_BOUND_HIDDEN = 2048


def default_graph_bucket_step(cfg: ModelConfig) -> int | None:
    """The fast path's graph row ladder for ``cfg`` (``EngineConfig.graph_bucket_step``): multiples of 128 above
    128 on a model of hidden size ``COMPUTE_BOUND_HIDDEN`` or more (the 8B shape), where a step of hundreds of rows
    is compute-bound and a padding row costs GEMM FLOPs; powers of two (``None``) below, where rows are nearly
    free beside the weights' read. Measured on the H200 (round 16, docs/engine.md "The graph row ladder"): the
    8B shape's offline set at 512 sequences ran 1.04x the tokens per second of powers of two at 128 (1.03x at
    256), the SmolLM2 shape 0.97x at 256."""
    return 128 if cfg.hidden_size >= COMPUTE_BOUND_HIDDEN else None


@dataclass(frozen=True)
class EngineConfig:
    """The engine's sizes and switches (the canonical config lives in ``CanonicalConfig``).

    ``max_num_seqs``: requests running at once (decode batch bound). ``max_fast_tokens``:
    token rows one fast step may process. ``kv_cache_tokens``: K/V store size; ``None`` sizes it
    from the device. ``block_size``: K/V page size. ``prefix_cache``: share canonical prefix
    blocks. ``seed``: seeds non-deterministic requests that give none. ``use_cuda_graphs``:
    replay captured graphs on CUDA. ``adaptive_draft``: halve/double each deterministic request's
    speculation depth on rollback/full acceptance. ``overlap``: launch fast step n+1 before reading
    step n's tokens back (one-step lag, as serving engines do; committed output is unchanged).
    ``max_model_len``: the longest prompt + output a request may have, and what every per-request
    table (RoPE, block tables, decode-graph bounds) is sized to; ``None``: the model's context
    capped by the K/V store (``model_len`` resolves it). It never changes a committed bit.
    ``canonical_thread``: on the CPU, run each canonical pass on a worker thread, so the fast steps
    of free requests go on while it runs (on CUDA a pass is always asynchronous: the device runs it
    while the host prepares the next step). Committed output is unchanged.
    ``max_canonical_tokens``: token rows one canonical pass may process, a multiple of R; ``None``:
    ``max_fast_tokens`` rounded down to a multiple of R, at least R (a deterministic prompt then
    blocks the device no longer per pass than a free prompt's chunk does). A pass of more than R rows
    carries prompt chunks, its GEMMs on R-row blocks: it never changes a committed bit.
    ``mixed_steps``: run a fast step's decode rows and free prompt chunks as one forward pass
    (``llm42.engine.mixed``) instead of two; ``None`` (default): where the fast path runs CUDA graphs;
    ``True`` also eagerly (the CPU suite tests it so); ``False``: two passes, as before. Committed
    output of deterministic requests is unchanged (the fast path may drift with the batch anyway).
    ``draft_ahead``: while a deterministic request's window is in a canonical pass, its fast path drafts
    the next window instead of waiting (kept when the pass accepts the whole window and commits the
    token drafted after it; ``llm42.engine.requests``); with llm42's own ``Verifier`` only. Committed
    output is unchanged.
    ``wide_verify``: verify windows fill passes of more than R rows too (G windows per R rows, the head and
    sampler on blocks of R result rows), so one pass verifies up to ``max_canonical_tokens`` rows of windows;
    ``None`` (default): on CUDA, where together with ``canonical_stream`` it measured best on the H200
    (round 9, docs/engine.md; on the caller's stream alone it gained nothing); off on the CPU. With
    llm42's own ``Verifier`` only. Committed output is unchanged.
    ``canonical_stream``: on CUDA, run each canonical pass on its own stream (its graphs captured there,
    with their own cuBLAS workspace), so that fast steps run beside it instead of queueing behind it;
    ``None`` (default): on CUDA unless a ``verifier`` is injected. No effect on the CPU (see
    ``canonical_thread``). Committed output is unchanged.
    ``prioritize_fast``: on CUDA, run each ``step()``'s own work (fast steps, staging, commits) on a stream of
    the device's highest priority, so a canonical pass on its own stream (the default priority, the lowest)
    yields the SMs to fast steps whenever both have blocks waiting. Measured on the H200 (round 14) it did not
    lower free requests' inter-token gaps online; off by default; no effect on the CPU. Committed output is
    unchanged (only the order in which the device runs independent work changes).
    ``canonical_priority``: on CUDA, the stream priority of the canonical pass's own stream against the fast
    steps' (which keep the default, lowest one): ``"low"`` (default) the same; ``"high"`` the device's highest
    (``CanonicalPass(priority=-1)``): whenever a pass and a fast step both have blocks waiting, the SMs go to the
    pass; ``"prompts"``: only passes that carry deterministic prompt chunks (``prompt_priority=-1``), verify-only
    passes at the lowest. Where deterministic requests are a run's tail (their prompts waiting for passes, their
    windows for verification) while free requests have time to spare, the pass's share of the device sets when
    the last request finishes. Other than ``"low"`` it needs the pass on its own stream (``canonical_stream``) and
    is refused beside ``prioritize_fast`` (the opposite order) and ``canonical_sms`` (a green context's stream has
    no priority). No effect on the CPU. Committed output is unchanged (only the order in which the device runs
    independent work changes).
    ``canonical_gemm_streams``: on CUDA, the streams a wide canonical pass's R-row GEMM blocks run on side by
    side (each block the very call an R-row pass makes: the same bits); ``1`` (default) runs them in turn.
    Measured on the H200 (round 15): 4 streams make a SmolLM2 2,048-row pass alone 0.88x as long, but served
    beside the fast steps dvr@50 fell from 0.70 to 0.62 of nondet, so it is off. With llm42's own ``Verifier``
    only. Committed output is unchanged.
    ``graph_bucket_step``: on CUDA, the row ladder of the fast path's captured prompt-row graphs and of a mixed
    step's decode rows (``llm42.cuda_graphs.row_buckets``): powers of two from 16 below it, then its multiples. A
    step pads its rows up to the next bucket, and on a compute-bound model a padding row costs a real row's GEMM
    FLOPs; a finer ladder pads less but captures more graphs. ``None`` (default): ``default_graph_bucket_step``
    of the model. A multiple of 16. Never changes a committed bit (the canonical pass does not use it).
    ``chain_passes``: where the verifier can stage a pass while the one before it runs (llm42's on CUDA,
    ``CanonicalPass.chains``), which plans go behind a pass in flight instead of waiting for it (at most two
    passes in flight): ``"prompts"`` (default) only plans made of the next chunks of deterministic prompts already
    in flight (round 22: a long prompt's chunks follow each other on the device); ``"all"`` any plan (its windows
    belong to requests in no pass, its prompt chunks to new prompts or follow chunks in flight); ``"off"`` none:
    windows and prompts wait for the pass in flight, drafting ahead meanwhile. Measured on the H200 (round 23,
    docs/benchmarks.md): ``"all"`` cut the real SmolLM2's dvr@50 steps 6-9 % and its rollbacks, but each step
    took longer and free requests' online gaps grew, for no throughput gained; so not the default. Committed
    output is unchanged (only when a pass runs changes).
    ``risk_margin``: a deterministic request's draft whose margin (``llm42.sampler.sample_with_margins``: how
    far, in logits, the fast path's choice was from another token) is under this closes its window: the window
    is due at once, ending with that draft, and the drafts after it wait in the next window. Numerics move a
    logit by little, so a small-margin draft is the one a pass is likely to reject; verified sooner, its
    rollback throws away fewer drafts. ``0`` (default) never closes a window early. Committed output is
    unchanged (only when a window is verified changes). The engine counts drafts by margin as passes verify
    them (``stats``: ``verified_margin_*`` / ``rejected_margin_*``), the data to set it from.
    ``canonical_sms``: on CUDA, the canonical pass's stream belongs to a green context of this many SMs
    (``torch.cuda.green_contexts``; the driver rounds up to its SM group, 8 on the H200): its kernels, captured
    there, never hold more of the device than that, so a pass beside a fast step leaves the rest of the SMs to
    it (the fast steps may still use these SMs too). ``None`` (default): every SM. Needs the pass on its own
    stream (``canonical_stream``) and a torch with green-context streams (2.11+, CUDA 12.8+); no effect on the
    CPU. Committed output is unchanged: a kernel's grid and each program's work do not depend on which SMs run
    it (tests/gpu/test_canonical_sms_cuda.py compares the bits).
    ``canonical_sms_max_rows`` (with ``canonical_sms``): only passes of at most this many rows (their graph bucket's:
    R, 2R, 4R, ... up to ``max_canonical_tokens``) run on the green context; a wider pass, which a backlog of
    deterministic work fills (every deterministic request of an offline batch waiting for its prompt or its
    window), runs on an ordinary stream with every SM. Online, passes are mostly narrow and stay confined, so free
    requests keep their steps' SMs; a backlog drains at the whole device's rate. At least R (``window * group``);
    ``None`` (default): every pass confined. No effect on the CPU. Committed output is unchanged (which SMs run a
    kernel never changes its bits; a pass's bucket, and so its SMs, follows from its rows alone).
    ``prompt_drafts``: a deterministic request's prompt also runs through the fast path, in the fast step's spare
    rows, while its canonical prefill waits for passes, and the request drafts from it: the first draft guesses the
    token the pass of the prompt's last chunk commits, and the drafts after it stand if it is that token (as drafts
    ahead of a window do). The fast path writes a prompt position's K/V only while no canonical pass has it, so
    every canonical read sees canonical K/V. It costs the fast path the prompt's rows and saves the request the
    wait for its prompt's passes before drafting. Needs ``draft_ahead`` (llm42's own ``Verifier``); off by default.
    Committed output is unchanged.
    ``split_pass_steps``: a step that applies a canonical pass's commits launches no pass; the canonical work the
    scheduler planned in it waits for the next step, its requests drafting ahead meanwhile (``stats``:
    ``split_passes``). Applying a pass (the commit rule, rollbacks, the decode rows' updates) and launching the
    next (staging its rows) are each host work of a step: in one step together they made the longest of free
    requests' inter-token gaps online (round 34, docs/benchmarks.md). It takes effect where a pass's requests can
    draft ahead (``draft_ahead``) and a fast step is in flight; off by default. Committed output is unchanged
    (only when a pass runs changes).
    ``pass_before_read``: with ``overlap``, a step launches its canonical pass (stages its rows, replays its graph)
    right after the fast step and before reading the previous fast step's tokens back, where no pass is in flight to
    wait for: the host's staging then runs while the device finishes that step. Round 34 timed each step's phases
    online (SmolLM2, an H100): plain steps spent 1.2 of 1.7 ms waiting in that read, and a step that launched a
    pass after it took 1.1 ms longer. ``False``: launched after the read, as before. Committed output is unchanged
    (the pass's windows are the rows the scheduler planned, whatever is read back after).
    ``apply_before_read``: with ``overlap``, a step also applies a canonical pass that has finished by the time its
    fast step is launched, before reading the previous fast step's tokens back, where the host's apply runs while the
    device finishes that step; without it such a pass is applied after the read, in the step's canonical phase, right
    before the next pass's launch: with ``step(deliver=...)`` both then fall into the same free inter-token gap (round
    38's phases, docs/benchmarks.md). The fast step just launched drafted from the state before the apply: its tokens
    of a request the pass rolled back are voided when read back, as those of the step already in flight always were.
    On by default since round 39: on two H100 hosts, real SmolLM2 online at 0.7 load, dvr@50, ABBA in one process,
    free requests' ITL over nondet p50 / p90 / p99 1.22 / 1.24 / 1.14 against 1.23 / 1.27 / 1.17 applied after the read
    (a fast host; better at every percentile in both repeats) and 1.56 / 2.03 / 1.86 against 1.57 / 2.32 / 2.18 (a
    slow host, the one pair that finished), offline dvr@50 the same (docs/benchmarks.md, "Round 39"); ``False``: after
    the read, as before. Committed output is unchanged (only when a pass is applied changes;
    tests/gpu/test_pass_order_cuda.py).
    ``canonical_slices``: run each canonical pass's layers in this many slices, one a step (the first where the
    pass is launched, the last with the head and the sampler): where a pass shares the device with fast steps, each
    fast step then shares it with a slice instead of the whole pass; the pass's commits come that many steps later
    at the least (a step that must wait for the pass runs the slices left at once). Each slice is a CUDA graph of its
    own on CUDA; at most the model's layers; not with ``canonical_thread``, llm42's own ``Verifier`` only; a sliced
    pass does not chain behind another (``chain_passes``). ``1`` (default): the whole pass at once. Committed output
    is unchanged: the same kernels on the same inputs in the same order (tests/gpu/test_canonical_slices_cuda.py).
    Measured on an H200 (round 35, real SmolLM2, docs/benchmarks.md): 4 slices left free requests' online ITL where it
    was (p50 / p99 over nondet 1.27x / 1.83x against 1.22x / 1.77x) and offline dvr@50 fell from 0.630 to 0.591 of
    nondet; so off.
    ``tune_decode_buckets``: when ``DVRGenerator.capture_graphs`` runs, time every fast decode bucket's graph and
    have a batch replay a larger bucket's graph where that one is faster (``FastStep.tune_decode_buckets``): the GEMM
    library's time is not monotone in the rows (round 52, an H100: the 8B shape's decode GEMMs 1.07-1.25x slower at
    288, 336, 352 and 448 rows than at 304, 368 and 512). Timing-based: the fast path's rounding may move from run to
    run; committed output is unchanged. ``False`` (default): measured in round 53 at 1.003x the 8B shape's offline
    throughput (11,915 against 11,876 tok/s, three repeats ABBA), within the spread.
    """

    max_num_seqs: int = 256
    max_fast_tokens: int = 512
    kv_cache_tokens: int | None = None
    block_size: int = 16
    prefix_cache: bool = True
    seed: int = 0
    use_cuda_graphs: bool = True
    adaptive_draft: bool = False
    overlap: bool = True
    max_model_len: int | None = None
    canonical_thread: bool = False
    max_canonical_tokens: int | None = None
    canonical_stream: bool | None = None
    mixed_steps: bool | None = None
    draft_ahead: bool = True
    wide_verify: bool | None = None
    prioritize_fast: bool = False
    canonical_priority: str = "low"
    canonical_gemm_streams: int = 1
    graph_bucket_step: int | None = None
    chain_passes: str = "prompts"
    risk_margin: float = 0.0
    canonical_sms: int | None = None
    canonical_sms_max_rows: int | None = None
    prompt_drafts: bool = False
    split_pass_steps: bool = False
    pass_before_read: bool = False
    apply_before_read: bool = True
    canonical_slices: int = 1
    tune_decode_buckets: bool = False

    def __post_init__(self) -> None:
        owner = "DVRGenerator"
        for name in ("max_num_seqs", "max_fast_tokens", "block_size", "canonical_gemm_streams", "canonical_slices"):
            positive_int(owner, name, getattr(self, name))
        for name in ("kv_cache_tokens", "max_model_len", "max_canonical_tokens", "graph_bucket_step",
                     "canonical_sms", "canonical_sms_max_rows"):
            if getattr(self, name) is not None:
                positive_int(owner, name, getattr(self, name))
        for name in ("prefix_cache", "use_cuda_graphs", "adaptive_draft", "overlap", "canonical_thread",
                     "draft_ahead", "prioritize_fast", "prompt_drafts", "split_pass_steps",
                     "pass_before_read", "apply_before_read", "tune_decode_buckets"):
            strict_bool(owner, name, getattr(self, name))
        if self.canonical_slices > 1 and self.canonical_thread:
            raise ValueError(f"{owner} canonical_slices runs a pass's slices on later steps: not with "
                             f"canonical_thread (a pass on a worker thread)")
        if self.prompt_drafts and not self.draft_ahead:
            raise ValueError(f"{owner} prompt_drafts drafts ahead of a prompt's canonical pass: it needs "
                             f"draft_ahead=True")
        if self.canonical_priority not in CANONICAL_PRIORITIES:
            raise ValueError(f"{owner} canonical_priority must be one of {CANONICAL_PRIORITIES}, got "
                             f"{self.canonical_priority!r}")
        if self.canonical_priority != "low" and self.prioritize_fast:
            raise ValueError(f"{owner} canonical_priority={self.canonical_priority!r} and prioritize_fast ask for "
                             f"opposite orders: pass one")
        if self.canonical_priority != "low" and self.canonical_sms is not None:
            raise ValueError(f"{owner} canonical_priority={self.canonical_priority!r} does not apply to "
                             f"canonical_sms's green-context stream (it has no priority): pass one")
        if self.canonical_sms_max_rows is not None and self.canonical_sms is None:
            raise ValueError(f"{owner} canonical_sms_max_rows bounds the passes canonical_sms confines: it needs "
                             f"canonical_sms")
        for name in ("mixed_steps", "canonical_stream", "wide_verify"):  # None: resolved by the device
            if getattr(self, name) is not None:
                strict_bool(owner, name, getattr(self, name))
        if self.graph_bucket_step is not None and self.graph_bucket_step % 16:
            raise ValueError(f"{owner} graph_bucket_step must be a multiple of 16, got {self.graph_bucket_step}")
        if self.chain_passes not in CHAIN_MODES:
            raise ValueError(f"{owner} chain_passes must be one of {CHAIN_MODES}, got {self.chain_passes!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"{owner} seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
        if isinstance(self.risk_margin, bool) or not isinstance(self.risk_margin, (int, float)):
            raise TypeError(f"{owner} risk_margin must be a number, got {type(self.risk_margin).__name__} "
                            f"{self.risk_margin!r}")
        if not 0.0 <= self.risk_margin < float("inf"):
            raise ValueError(f"{owner} risk_margin must be a finite number >= 0, got {self.risk_margin!r}")

    @classmethod
    def of_knobs(cls, kwargs: Mapping[str, object]) -> EngineConfig:
        """The config of the engine knobs among ``kwargs`` (others ignored): rejects bad ones before
        anything is loaded."""
        return cls(**{f.name: kwargs[f.name] for f in fields(cls) if f.name in kwargs})

    def check_model(self, cfg: ModelConfig, *, window: int, num_rows: int) -> None:
        """Refuse knobs ``cfg`` and the canonical pass's R = ``num_rows`` cannot take: more canonical slices than
        layers, a window past the context, a bound on the confined passes under R."""
        if self.canonical_sms_max_rows is not None and self.canonical_sms_max_rows < num_rows:
            raise ValueError(f"DVRGenerator canonical_sms_max_rows ({self.canonical_sms_max_rows}) is under the "
                             f"canonical pass's R = window * group = {num_rows} rows: no pass would be confined")
        if self.canonical_slices > cfg.num_layers:
            raise ValueError(f"DVRGenerator canonical_slices ({self.canonical_slices}) exceeds the model's "
                             f"{cfg.num_layers} layers")
        if window > cfg.max_position_embeddings:
            raise ValueError(f"window ({window}) exceeds the model's context of {cfg.max_position_embeddings} tokens")

    def check_injected_verifier(self, verifier, *, has_canonical_policy: bool) -> None:
        """Refuse the knobs of llm42's own canonical pass beside a user's ``verifier``, which runs its own passes
        (TypeError: no ``verify``)."""
        if not callable(getattr(verifier, "verify", None)):
            raise TypeError(f"verifier must have verify(work, kv), got {type(verifier).__name__}")
        if has_canonical_policy:
            raise ValueError("pass canonical_policy or verifier, not both: a verifier brings its own policy")
        for knob, is_set, instead in (
                ("canonical_stream", bool(self.canonical_stream), "use_stream=True"),
                ("canonical_sms", self.canonical_sms is not None, "use_stream=True, num_sms=..."),
                ("canonical_priority", self.canonical_priority != "low", "use_stream=True, priority=-1"),
                ("canonical_slices", self.canonical_slices != 1, "num_slices=N")):
            if is_set:
                raise ValueError(f"pass {knob} or verifier, not both: a verifier runs its own passes "
                                 f"(Verifier(..., {instead}))")

    def resolve_canonical_stream(self, device: torch.device, *, has_verifier: bool) -> bool:
        """``canonical_stream`` resolved on ``device`` (``None``: on CUDA unless a verifier is injected), with the
        knobs that need the pass's own stream checked against it (and ``canonical_sms`` against the SMs)."""
        is_cuda = device.type == "cuda"
        use_stream = is_cuda and not has_verifier if self.canonical_stream is None else self.canonical_stream
        if not is_cuda:
            return use_stream
        if self.canonical_sms is not None:
            if not use_stream:
                raise ValueError("DVRGenerator canonical_sms confines the canonical pass's own stream: it needs "
                                 "canonical_stream (True or None), got canonical_stream=False")
            from llm42.cuda_graphs import green_contexts_supported

            if not green_contexts_supported():
                raise ValueError("DVRGenerator canonical_sms needs CUDA green contexts with a stream of their own "
                                 f"(torch >= 2.11 built with CUDA >= 12.8); this torch is {torch.__version__}")
            total = torch.cuda.get_device_properties(device).multi_processor_count
            if self.canonical_sms > total:
                raise ValueError(f"DVRGenerator canonical_sms ({self.canonical_sms}) exceeds the device's "
                                 f"{total} SMs")
        if self.canonical_priority != "low" and not use_stream:
            raise ValueError(f"DVRGenerator canonical_priority={self.canonical_priority!r} raises the "
                             "canonical pass's own stream: it needs canonical_stream (True or None), got "
                             "canonical_stream=False")
        return use_stream

    def canonical_stream_priorities(self) -> tuple[int, int | None]:
        """(``priority``, ``prompt_priority``) of the canonical pass's streams (``CanonicalPass``), from
        ``canonical_priority`` (CUDA's priorities: lower is higher; -1 is in every device's range)."""
        return {"low": (0, None), "prompts": (0, -1), "high": (-1, None)}[self.canonical_priority]

    def canonical_tokens(self, num_rows: int) -> int:
        """The most rows one canonical pass of R = ``num_rows`` takes (``max_canonical_tokens`` resolved)."""
        if self.max_canonical_tokens is None:
            return max(num_rows, self.max_fast_tokens // num_rows * num_rows)
        if self.max_canonical_tokens % num_rows:
            raise ValueError(f"DVRGenerator max_canonical_tokens ({self.max_canonical_tokens}) must be a multiple "
                             f"of R = window x group = {num_rows}")
        return self.max_canonical_tokens

    def bucket_step(self, cfg: ModelConfig) -> int | None:
        """``graph_bucket_step`` resolved for ``cfg`` (``default_graph_bucket_step`` where it is ``None``)."""
        return default_graph_bucket_step(cfg) if self.graph_bucket_step is None else self.graph_bucket_step

    def model_len(self, cfg: ModelConfig, kv_capacity: int) -> int:
        """The longest request for ``cfg`` over a K/V store of ``kv_capacity`` tokens: ``max_model_len``,
        else the model's context capped by the store (a longer request could never be admitted)."""
        context = cfg.max_position_embeddings
        if self.max_model_len is None:
            return min(context, kv_capacity)
        if self.max_model_len > context:
            raise ValueError(f"DVRGenerator max_model_len ({self.max_model_len}) exceeds the model's context "
                             f"of {context} tokens (max_position_embeddings)")
        if self.max_model_len > kv_capacity:
            raise ValueError(f"DVRGenerator max_model_len ({self.max_model_len}) exceeds the K/V store's "
                             f"{kv_capacity} tokens: pass a larger kv_cache_tokens or a smaller max_model_len")
        return self.max_model_len
