"""DVRGenerator: the public facade of the decode–verify–rollback engine.

One ``step()`` reads like the design: schedule -> fast step -> canonical pass -> commit.
Non-deterministic requests commit fast-path tokens directly; a deterministic request's
fast-path tokens are candidates until a canonical pass commits (or replaces) them.

The loop overlaps host and device (``overlap=True``, the default). A fast step's
tokens stay on the device, where the next step reads them (``DecodeState``); the host
reads them back one step later, while the device already runs the next step. A
canonical pass runs on its own CUDA stream and is applied when it has finished, so
free requests' decode steps never wait for it. Commits and stops are decided on
committed tokens only, so the lag changes when tokens are reported, never which.

Threads: one re-entrant lock serialises every public call (submit, step, abort, result,
...), so several threads may share a generator; one engine loop owning ``step()`` is
still the intended shape (docs/engine.md, "Threads").
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import random
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from llm42.cuda_graphs import lend_streams
from llm42.engine.config import EngineConfig, positive_int
from llm42.engine.decode_state import DecodeState
from llm42.engine.fast_step import FastStep
from llm42.engine.passes import CanonicalPasses
from llm42.engine.requests import Request, RequestPool
from llm42.defaults import default_canonical_size
from llm42.kv import KVStore, KVStoreProtocol
from llm42.model.config import ModelConfig
from llm42.model.gguf import find_gguf_file
from llm42.model.loader import (
    check_state_dict, embedded_model_path, load_checkpoint, load_state_dict, load_tokenizer,
)
from llm42.model.weights import Weights, random_weights, weight_views, with_rope_positions
from llm42.params import Completion, SamplingParams, sample_seed
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.policies.base import ReductionPolicy
from llm42.policies.fast import canonical_decode_mismatches
from llm42.prompts import Tokenizer, encode_prompt
from llm42.runner import ModelRunner
from llm42.scheduler import (ADMISSIONS, DefaultScheduler, Plan, PrefillChunk, Scheduler, SchedulerState,
                             validate_plan)
from llm42.scoring import ScoreJob, score_jobs
from llm42.verify import CanonicalConfig, Verifier


def _default_kv_tokens(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_num_seqs: int,
                       max_model_len: int | None) -> int:
    """Sized by the longest request, ``max_model_len`` (left out: the model's whole context). On CUDA:
    room for ``max_num_seqs`` such requests, capped at half of the memory free after the weights (a
    serving engine's batch must not be bounded by its K/V store; vLLM takes 90 %), never less than one.
    On the CPU: room for 16 of them capped by 64K tokens and 256 MiB (allocating, zeroing, is part of
    start-up), never less than one given ``max_model_len``, nor, left out, than 2048 tokens or the
    context if shorter. A request that does not fit is refused; pass ``kv_cache_tokens`` for more."""
    context = cfg.max_position_embeddings if max_model_len is None else max_model_len
    bytes_per_token = 2 * cfg.num_layers * cfg.kv_size * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return max(context, min(max_num_seqs * context, free_bytes // 2 // bytes_per_token))
    cap = min(1 << 16, (256 << 20) // bytes_per_token)
    floor = min(context, 2048) if max_model_len is None else max_model_len
    return max(floor, min(16 * context, cap))


# how long a step with nothing to launch waits for the canonical pass in flight before it returns
_IDLE_WAIT_S = 0.005


def _planned_windows(plan: Plan, state: SchedulerState) -> dict[int, int]:
    """The candidates of each window in ``plan.verify`` as ``state`` showed them (the rows ``validate_plan`` counted)."""
    verify = set(plan.verify)
    return {v.rid: v.num_candidates for v in state.requests if v.rid in verify}


def _finish_request(pool: RequestPool, kv, decode_state: DecodeState, tokenizer, req: Request) -> None:
    """End ``req``: its K/V, seat and decode row freed, its Completion kept (``RequestPool.finish``)."""
    pool.finish(req, kv, tokenizer)
    decode_state.release(req.slot)


def _check_injected(name: str, value, protocol, what: str) -> None:
    if value is not None and not isinstance(value, protocol):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


class _Owner:
    """A generate() or stream() call in progress: its requests' Completions are kept for it, and a
    stream's committed tokens are queued for it whoever steps the generator."""

    def __init__(self, *, is_stream: bool):
        self.tokens: deque[tuple[int, list[int]]] | None = deque() if is_stream else None


# ``step(deliver=...)``: receives a step's tokens committed by the time the fast step is read back, per request id
Deliver = Callable[[dict[int, list[int]]], None]


def takes_deliver(step) -> bool:
    """Whether a generator's ``step`` takes ``deliver`` (a ``DVRGenerator``'s does; a stand-in's may not)."""
    try:
        return "deliver" in inspect.signature(step).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def _serialised(method):
    """Run ``method`` under the generator's lock, refusing once the generator is closed."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            if self._is_closed:
                raise RuntimeError("this DVRGenerator is closed")
            return method(self, *args, **kwargs)

    return locked


class DVRGenerator:
    """Generation whose ``deterministic=True`` requests are bit-reproducible under dynamic batching.

    Build one with :meth:`from_pretrained` (a Hugging Face checkpoint directory or GGUF file)
    or :meth:`from_config` (seeded random weights). ``window`` (T) and ``group`` (G) fix the
    canonical pass at R = T * G rows; committed deterministic output is a function of the
    weights, the prompt, the sampling params and this canonical config only. The engine's
    other knobs are ``EngineConfig``'s fields, passed as keywords. On CUDA
    (``use_cuda_graphs=True``) the canonical pass is replayed from one captured graph and
    fast decode steps (forward and sampler) from per-bucket graphs.
    """

    def __init__(
        self,
        weights: Weights,
        cfg: ModelConfig,
        *,
        tokenizer=None,
        window: int = 32,
        group: int = 8,
        scheduler: Scheduler | None = None,
        kv_store: KVStoreProtocol | None = None,
        fast_policy: ReductionPolicy | None = None,
        canonical_policy: ReductionPolicy | None = None,
        verifier: Verifier | None = None,
        max_num_seqs: int = 256,
        max_fast_tokens: int = 512,
        kv_cache_tokens: int | None = None,
        block_size: int = 16,
        prefix_cache: bool = True,
        seed: int = 0,
        use_cuda_graphs: bool = True,
        adaptive_draft: bool = False,
        overlap: bool = True,
        max_model_len: int | None = None,
        canonical_thread: bool = False,
        max_canonical_tokens: int | None = None,
        canonical_stream: bool | None = None,
        mixed_steps: bool | None = None,
        draft_ahead: bool = True,
        wide_verify: bool | None = None,
        prioritize_fast: bool = False,
        canonical_priority: str = "low",
        canonical_gemm_streams: int = 1,
        graph_bucket_step: int | None = None,
        chain_passes: str = "prompts",
        risk_margin: float = 0.0,
        canonical_sms: int | None = None,
        canonical_sms_max_rows: int | None = None,
        prompt_drafts: bool = False,
        split_pass_steps: bool = False,
        pass_before_read: bool = False,
        apply_before_read: bool = True,
        canonical_slices: int = 1,
        tune_decode_buckets: bool = False,
    ):
        self.canonical_config = CanonicalConfig(window=window, group=group)
        self.config = EngineConfig(
            max_num_seqs=max_num_seqs, max_fast_tokens=max_fast_tokens, kv_cache_tokens=kv_cache_tokens,
            block_size=block_size, prefix_cache=prefix_cache, seed=seed, use_cuda_graphs=use_cuda_graphs,
            adaptive_draft=adaptive_draft, overlap=overlap, max_model_len=max_model_len,
            canonical_thread=canonical_thread, max_canonical_tokens=max_canonical_tokens,
            canonical_stream=canonical_stream, mixed_steps=mixed_steps, draft_ahead=draft_ahead,
            wide_verify=wide_verify, prioritize_fast=prioritize_fast, canonical_priority=canonical_priority,
            canonical_gemm_streams=canonical_gemm_streams, graph_bucket_step=graph_bucket_step,
            chain_passes=chain_passes, risk_margin=risk_margin, canonical_sms=canonical_sms,
            canonical_sms_max_rows=canonical_sms_max_rows, prompt_drafts=prompt_drafts,
            split_pass_steps=split_pass_steps, pass_before_read=pass_before_read,
            apply_before_read=apply_before_read, canonical_slices=canonical_slices,
            tune_decode_buckets=tune_decode_buckets,
        )
        num_canonical_tokens = self.config.canonical_tokens(self.canonical_config.num_rows)
        scratch = getattr(kv_store, "num_scratch_slots", None)  # an injected store: a pass's padding rows write there
        if scratch is not None and scratch < num_canonical_tokens:
            if max_canonical_tokens is not None:
                raise ValueError(f"DVRGenerator max_canonical_tokens ({max_canonical_tokens}) exceeds the injected "
                                 f"kv_store's {scratch} scratch slots")
            num_canonical_tokens = max(self.canonical_config.num_rows,
                                       scratch // self.canonical_config.num_rows * self.canonical_config.num_rows)
        _check_injected("scheduler", scheduler, Scheduler, "a Scheduler (an object with schedule(state))")
        _check_injected("fast_policy", fast_policy, ReductionPolicy, "a ReductionPolicy")
        _check_injected("canonical_policy", canonical_policy, ReductionPolicy, "a ReductionPolicy")
        _check_injected("kv_store", kv_store, KVStoreProtocol, "a KVStoreProtocol")
        _check_injected("tokenizer", tokenizer, Tokenizer, "a tokenizer (callable, with decode(ids))")
        self.config.check_model(cfg, window=window, num_rows=self.canonical_config.num_rows)
        if verifier is not None:
            self.config.check_injected_verifier(verifier, has_canonical_policy=canonical_policy is not None)
        if kv_store is not None:
            kv_capacity = kv_store.num_blocks * kv_store.block_size
        else:
            if kv_cache_tokens is None:
                kv_cache_tokens = _default_kv_tokens(cfg, weights.dtype, weights.device, max_num_seqs, max_model_len)
            kv_capacity = -(-kv_cache_tokens // block_size) * block_size
        # resolved (and refused) before anything is allocated
        self.max_model_len = self.config.model_len(cfg, kv_capacity)
        weights = with_rope_positions(weights, cfg, self.max_model_len)
        self.cfg = cfg
        self.weights = weights
        self.tokenizer = tokenizer
        self.device = weights.device
        self.runner = ModelRunner(weights, cfg)
        self.fast_policy = fast_policy if fast_policy is not None else FastPolicy()
        self.canonical_policy = canonical_policy if canonical_policy is not None else FixedShapePolicy()
        is_graphed = use_cuda_graphs and self.device.type == "cuda"
        is_cuda = self.device.type == "cuda"
        # on CUDA the default: fast steps run beside the passes (round 9)
        canonical_stream = self.config.resolve_canonical_stream(self.device, has_verifier=verifier is not None)
        # prioritize_fast: each step's work on a high-priority stream (CUDA's priorities: lower is higher; -1 is
        # in every device's range), the canonical pass's stream keeping the default, lowest priority
        self._step_stream = (lend_streams(self, self.device, 1, priority=-1)[0] if is_cuda and prioritize_fast
                             else None)
        if wide_verify is None:
            wide_verify = is_cuda
        priority, prompt_priority = self.config.canonical_stream_priorities() if is_cuda else (0, None)
        if verifier is None:
            verifier = Verifier(self.runner, self.canonical_policy, self.canonical_config,
                                use_graph=None if is_graphed else False, use_thread=canonical_thread,
                                max_model_len=self.max_model_len, max_rows=num_canonical_tokens,
                                use_stream=canonical_stream, gemm_streams=self.config.canonical_gemm_streams,
                                num_sms=self.config.canonical_sms,
                                sms_max_rows=self.config.canonical_sms_max_rows,
                                priority=priority, prompt_priority=prompt_priority,
                                num_slices=self.config.canonical_slices)
        else:
            self.canonical_policy = getattr(verifier, "policy", self.canonical_policy)
            own = getattr(verifier, "max_rows", self.canonical_config.num_rows)  # a user's verifier: R rows
            if max_canonical_tokens is not None and max_canonical_tokens != own:
                raise ValueError(f"DVRGenerator max_canonical_tokens ({max_canonical_tokens}) differs from the "
                                 f"injected verifier's passes of {own} rows")
            num_canonical_tokens = own
        self.verifier = verifier
        mismatches = canonical_decode_mismatches(self.fast_policy, self.canonical_policy)
        if mismatches:
            warnings.warn("DVRGenerator: the fast path's decode rows take another canonical attention than the "
                          f"canonical pass runs ({'; '.join(mismatches)}): deterministic outputs keep the contract, "
                          "but those rows will agree with the canonical pass less often (more rollbacks)",
                          stacklevel=2)
        # drafting ahead of a window in a pass needs a verifier that leaves the rollback of K/V to the engine
        self._draft_ahead = draft_ahead and isinstance(verifier, Verifier)
        if prompt_drafts and not self._draft_ahead:
            raise ValueError("DVRGenerator prompt_drafts needs llm42's own Verifier (it drafts ahead of a prompt's "
                             f"canonical pass), not an injected {type(verifier).__name__}")
        self._prompt_drafts = prompt_drafts
        self.max_canonical_tokens = num_canonical_tokens
        # llm42's verifier computes results for every row of a wide pass (its windows' too); another, for R rows
        self._max_canonical_results = (num_canonical_tokens if wide_verify and isinstance(verifier, Verifier)
                                       else None)
        self.scheduler = scheduler if scheduler is not None else DefaultScheduler()
        admission = getattr(self.scheduler, "admission", "arrival")
        if admission not in ADMISSIONS:
            raise ValueError(f"DVRGenerator scheduler's admission must be one of {ADMISSIONS}, got {admission!r}")
        max_wait_steps = getattr(self.scheduler, "max_wait_steps", None)
        if max_wait_steps is not None:
            positive_int("DVRGenerator scheduler's", "max_wait_steps", max_wait_steps)
        self._owns_kv = kv_store is None  # close() drops the K/V of a store it made, not of one it was handed
        if kv_store is None:
            kv_store = KVStore(
                cfg,
                num_blocks=kv_capacity // block_size,
                block_size=block_size,
                num_scratch_slots=max(num_canonical_tokens, max_fast_tokens),
                dtype=weights.dtype,
                device=self.device,
                enable_prefix_cache=prefix_cache,
            )
        self.kv = kv_store
        self.decode_state = DecodeState(weights, cfg, self.kv, self.fast_policy, max_num_seqs=max_num_seqs,
                                        max_model_len=self.max_model_len)
        self._rng = random.Random(seed)  # seeds for non-deterministic requests that give none
        self._num_ids = 0
        self._pool = RequestPool(max_num_seqs=max_num_seqs, window=window, adaptive_draft=adaptive_draft,
                                 risk_margin=float(risk_margin), admission=admission,
                                 max_wait_steps=max_wait_steps)
        self.stats = self._pool.stats
        self.fast_step = FastStep.of_config(self.runner, self.kv, self.decode_state, self.fast_policy, self._pool,
                                            self.config, max_model_len=self.max_model_len, use_graphs=is_graphed)
        self._num_steps = 0
        self._events: dict[int, list[int]] = {}
        # the generator's parts, not the generator: a reference back to it would keep its tensors in a cycle
        self._finish = functools.partial(_finish_request, self._pool, self.kv, self.decode_state, tokenizer)
        self.passes = CanonicalPasses(self.verifier, pool=self._pool, kv=self.kv, decode_state=self.decode_state,
                                      fast_step=self.fast_step, config=self.config,
                                      canonical_config=self.canonical_config, is_drafting_ahead=self._draft_ahead,
                                      finish=self._finish)
        self._lock = threading.RLock()
        self._is_closed = False
        self._owners: dict[int, _Owner] = {}  # rid -> the generate()/stream() call that submitted it

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        window: int | None = None,
        group: int | None = None,
        tensor_parallel: int = 1,
        **kwargs,
    ) -> "DVRGenerator":
        """Load a HF checkpoint directory, a ``.gguf`` file or a directory holding one (dequantized to
        ``dtype``); ``None``: the embedded stories260K model.

        ``window``/``group`` left out: the device's defaults, 32 x 8 on CUDA and 8 x 4 on the
        CPU (``llm42.defaults``); they are part of the canonical config, so pass them explicitly
        where runs on different devices or versions must agree.

        ``tensor_parallel=n`` (n > 1): this process is one rank of an initialized process group of
        n ranks (``llm42.distributed.launch`` or torchrun); it loads only its slice of a HF
        safetensors directory (``llm42.distributed.load_shard``), on ``cuda:LOCAL_RANK`` when
        ``device`` is ``"cuda"``, and every rank must then make the same calls in the same order.
        ``gen.cfg`` is then the rank's config (heads and FFN width divided by n). CUDA graphs are
        off under tensor parallelism; ``update_weights`` is refused.

        ``max_model_len`` (an engine knob, like the others in ``kwargs``): the RoPE tables are
        loaded with that many rows, never the checkpoint's whole context.
        """
        device = torch.device(device)
        default_window, default_group = default_canonical_size(device)
        window = default_window if window is None else window
        group = default_group if group is None else group
        # reject bad sizes before loading anything
        CanonicalConfig(window=window, group=group)
        EngineConfig.of_knobs(kwargs)
        path = embedded_model_path() if path is None else Path(path)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        tokenizer = kwargs.pop("tokenizer", None)
        if not isinstance(tensor_parallel, int) or isinstance(tensor_parallel, bool) or tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be a positive int, got {tensor_parallel!r}")
        if tensor_parallel > 1:
            return cls._from_shard(path, tensor_parallel, device=device, dtype=dtype, tokenizer=tokenizer,
                                   window=window, group=group, **kwargs)
        checkpoint = load_checkpoint(path, dtype=dtype, device=device, with_tokenizer=tokenizer is None,
                                     num_positions=kwargs.get("max_model_len"))
        return cls(checkpoint.weights, checkpoint.cfg, tokenizer=tokenizer or checkpoint.tokenizer,
                   window=window, group=group, **kwargs)

    @classmethod
    def _from_shard(cls, path: Path, tensor_parallel: int, *, device: torch.device, dtype: torch.dtype,
                    tokenizer, **kwargs) -> "DVRGenerator":
        from llm42.distributed import TensorParallel, load_shard

        if find_gguf_file(path) is not None:
            raise ValueError("tensor_parallel > 1 loads a Hugging Face safetensors directory, not a GGUF file")
        tp = TensorParallel.from_world(tensor_parallel)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", tp.rank)))
        _, local_cfg, weights = load_shard(path, tp, dtype=dtype, device=device,
                                           num_positions=kwargs.get("max_model_len"))
        if tokenizer is None:
            tokenizer = load_tokenizer(path)
        kwargs["use_cuda_graphs"] = False  # collectives are not captured: every step runs eagerly
        return cls(weights, local_cfg, tokenizer=tokenizer, **kwargs)

    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        *,
        weight_seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        lm_head_std: float | None = None,
        **kwargs,
    ) -> "DVRGenerator":
        """A generator over seeded random weights for ``cfg`` (tests, benchmarks; no checkpoint)."""
        weights = random_weights(cfg, seed=weight_seed, dtype=dtype, device=device, lm_head_std=lm_head_std)
        return cls(weights, cfg, **kwargs)

    # -- validation -----------------------------------------------------------------------------
    def _encode(self, prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.cfg.vocab_size)

    def _check(self, prompt: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        # max_model_len <= the K/V store's capacity, so a request within it can always be admitted
        if len(prompt) + params.max_new_tokens > self.max_model_len:
            context = self.cfg.max_position_embeddings
            limit = (f"the model's context of {context} tokens" if self.max_model_len == context else
                     f"max_model_len, {self.max_model_len} tokens (the model's context is {context})")
            raise ValueError(
                f"prompt ({len(prompt)} tokens) plus max_new_tokens ({params.max_new_tokens}) exceeds {limit}"
            )

    # -- online API -----------------------------------------------------------------------------
    @_serialised
    def submit(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. Bad input raises before anything is queued.

        ``params.n > 1`` needs one id per sample: use :meth:`submit_samples`.
        """
        params = SamplingParams() if params is None else params
        if isinstance(params, SamplingParams) and params.n > 1:
            raise ValueError(f"SamplingParams.n is {params.n}: submit() queues one request; "
                             "submit_samples() queues the n samples and returns their ids")
        return self.submit_samples(prompt, params)[0]

    @_serialised
    def submit_samples(self, prompt, params: SamplingParams | None = None) -> list[int]:
        """Queue ``params.n`` samples of one prompt; returns their ids, sample 0 first.

        Sample i is seeded with ``llm42.params.sample_seed(seed, i)`` (``seed``: ``params.seed``, else
        0 for a deterministic request, else a draw from the generator's RNG).
        """
        params = SamplingParams() if params is None else params
        ids = self._encode(prompt)
        self._check(ids, params)
        return self._enqueue(ids, params)

    def _enqueue(self, ids: list[int], params: SamplingParams) -> list[int]:
        if params.seed is not None:
            seed = params.seed
        elif params.deterministic:
            seed = 0
        else:
            seed = self._rng.getrandbits(63)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.cfg.eos_token_ids)
        rids = []
        for index in range(params.n):
            rid = self._num_ids
            self._num_ids += 1
            self._pool.enqueue(Request(rid, ids, params, sample_seed(seed, index), frozenset(stop_ids)),
                               self._num_steps)
            rids.append(rid)
        return rids

    @_serialised
    def has_unfinished(self) -> bool:
        return self._pool.has_unfinished()

    @property
    def num_running(self) -> int:
        """Requests admitted (holding K/V and a seat) and not finished."""
        return len(self._pool.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission."""
        return len(self._pool.waiting)

    def _state_of(self, rid: int) -> str:
        """The pool's state, or 'taken' for an id whose Completion was handed over; KeyError if never issued."""
        state = self._pool.state_of(rid)
        if state != "unknown":
            return state
        if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < self._num_ids:
            return "taken"
        raise KeyError(f"unknown request id {rid!r}")

    @_serialised
    def is_finished(self, rid: int) -> bool:
        """Whether request ``rid`` has finished (stopped, hit its length, or aborted); KeyError if unknown."""
        return self._state_of(rid) in ("finished", "taken")

    @_serialised
    def result(self, rid: int) -> Completion:
        """Hand over the Completion of a finished request, once: the generator forgets it.

        Raises ValueError if it has not finished, KeyError if it was already taken or the id is unknown.
        """
        state = self._state_of(rid)
        if state == "finished":
            if rid in self._owners:
                raise ValueError(f"request {rid} belongs to a generate() or stream() call, which returns it")
            return self._pool.finished.pop(rid)
        if state == "taken":
            raise KeyError(f"the Completion of request {rid} was already taken (result, abort or generate)")
        raise ValueError(f"request {rid} has not finished")

    @_serialised
    def abort(self, rid: int) -> Completion:
        """Stop request ``rid`` now and hand over its Completion (``finish_reason == "abort"``).

        A waiting request leaves the queue; a running one frees its K/V and seat and keeps every
        token committed so far. If a canonical pass is in flight for it, the pass is first
        completed and applied (it writes the request's K/V blocks), so its commit may still
        land or even finish the request, whose Completion then keeps its own finish reason.
        A finished request not yet collected returns its Completion. Other requests are not
        disturbed. KeyError for an unknown id or a Completion already taken.
        """
        self._stop(rid)
        if self._state_of(rid) == "taken":
            raise KeyError(f"the Completion of request {rid} was already taken (result, abort or generate)")
        owned = rid in self._owners  # a generate()/stream() call returns it to its own caller as well
        return self._pool.finished[rid] if owned else self._pool.finished.pop(rid)

    def _stop(self, rid: int) -> None:
        """Finish a waiting or running request with reason "abort" (no-op for a finished one)."""
        state = self._state_of(rid)
        if state == "waiting":
            self._pool.abort_waiting(rid, self.tokenizer)
            return
        if state != "running":
            return
        req = self._pool.running[rid]
        while req.is_verifying and self.passes.oldest is not None:
            self.passes.apply_oldest(self._events)  # it writes req's blocks: let it land before they are freed
            self._deliver(self._events)
        if self._pool.running.get(rid) is req:
            req.finish_reason = "abort"
            self._finish(req)  # a fast token still in flight for it is dropped when read back

    @_serialised
    def step(self, deliver: Deliver | None = None) -> dict[int, list[int]]:
        """One engine iteration: schedule -> fast step -> canonical pass -> commit.

        Returns the tokens newly committed in this step, per request id (a ``stream()``
        call's requests excepted: their tokens go to that stream, whoever steps).

        ``deliver``: called once in the step, as soon as the previous fast step's tokens are read back and
        before the step's canonical phase (applying and launching passes: host work a step with a pass does
        after the read), with the tokens committed so far: free requests' tokens of that fast step, and
        deterministic requests' from passes applied before it (at the top of the step, and with
        ``apply_before_read`` right before the read). Those tokens are not in the
        returned dict, which holds the ones committed after the call: each token is reported once. A server
        hands free tokens to its clients that much sooner (``AsyncEngine`` does). Not called where nothing was
        committed by then; if it raises, the step raises and its tokens come again with the next step.
        """
        # events live on the generator until returned: if a later phase of this step raises,
        # tokens an earlier phase already committed are reported by the next successful step
        events = self._events
        try:
            if self._step_stream is None:
                self._step(events, deliver)
            else:  # ordered after the caller's work, and the caller's later work after it
                caller = torch.cuda.current_stream(self.device)
                self._step_stream.wait_stream(caller)
                try:
                    with torch.cuda.stream(self._step_stream):
                        self._step(events, deliver)
                finally:
                    caller.wait_stream(self._step_stream)
        finally:
            self._deliver(events)
        self._num_steps += 1
        self.stats["steps"] += 1
        self._events = {}
        return events

    def _step(self, events: dict[int, list[int]], deliver: Deliver | None) -> None:
        if self._pool.unfreed:
            self._pool.retry_frees(self.kv)
        self._admit()
        passes = self.passes
        passes.advance()  # a sliced pass's next slice (canonical_slices): one a step
        applied = passes.apply_ready(events)  # whether this step applied a pass (``split_pass_steps``)
        state = SchedulerState(self._pool.views(), self.canonical_config.window, self.canonical_config.group,
                               self.config.max_fast_tokens, self._num_steps, self.max_canonical_tokens,
                               self._max_canonical_results, passes.num_in_flight)
        plan = self.scheduler.schedule(state)
        validate_plan(plan, state)
        # each window's candidates as planned (its rows): drafts read back before the pass launches (overlap=False
        # reads this step's own) stay ahead of the window instead of growing it past the rows the plan was checked for
        windows = _planned_windows(plan, state) if plan.verify else {}
        plan = self._with_drafts_ahead(plan)
        prompt_drafts = self._prompts_to_draft(plan)
        fast = self.fast_step
        is_idle = fast.in_flight is None and passes.oldest is None
        if plan.is_empty and not prompt_drafts and is_idle and self._pool.running:
            raise RuntimeError(
                f"scheduler {type(self.scheduler).__name__} returned an empty plan with "
                f"{len(self._pool.running)} requests running; no progress is possible"
            )
        previous = fast.take()
        early = False
        try:
            fast.launch(plan, prompt_drafts)  # leaves what ran in flight, even if part of the step failed
            if self.config.apply_before_read and self.config.overlap:
                # a pass that finished since the top of the step: applied while the device finishes the fast step
                # read below, not after that read beside the next pass's launch
                applied = passes.apply_ready(events) or applied
            # the pass goes out before the previous fast step is read back where nothing waits for a pass in flight:
            # its host work (staging its rows) then runs while the device finishes that step, instead of after
            early = (self.config.pass_before_read and self.config.overlap and plan.has_canonical_pass
                     and passes.oldest is None)
            if early:
                passes.run(plan, windows, events, applied=applied)
        finally:
            fast.read(previous, events, self._finish)
        if not self.config.overlap:
            fast.read(fast.take(), events, self._finish)
        if deliver is not None:
            self._deliver_early(events, deliver)
        if plan.is_empty and fast.in_flight is None:
            # nothing else to launch: wait (a little) for the pass here instead of returning an empty step
            # the caller would spin on (AsyncEngine drains its commands between steps)
            passes.wait_briefly(events, _IDLE_WAIT_S)
        if plan.has_canonical_pass and not early:
            passes.run(plan, windows, events, applied=applied)

    def _with_drafts_ahead(self, plan: Plan) -> Plan:
        """The plan plus, in the fast step's spare rows, a decode row for each deterministic request whose
        window is due, in a pass or in this plan's pass (``verify``: a partial window too) and that may draft ahead
        of it (the scheduler never sees those drafts)."""
        if not self._draft_ahead:
            return plan
        spare = self.config.max_fast_tokens - len(plan.fast_decode) - sum(c.num_tokens for c in plan.fast_prefill)
        if spare <= 0:
            return plan
        ahead = self._pool.drafting_ahead(set(plan.fast_decode), spare, joining=set(plan.verify))
        return dataclasses.replace(plan, fast_decode=plan.fast_decode + tuple(ahead)) if ahead else plan

    def _prompts_to_draft(self, plan: Plan) -> list[PrefillChunk]:
        """``prompt_drafts``: chunks of deterministic prompts in the rows the plan (drafts ahead included) leaves in
        the fast step, for their requests to draft from before their prompts' passes commit."""
        if not self._prompt_drafts:
            return []
        spare = self.config.max_fast_tokens - len(plan.fast_decode) - sum(c.num_tokens for c in plan.fast_prefill)
        # no more prompt chunks in all than the fast path's prompt staging holds (a step with more runs eagerly)
        chunks = self.fast_step.fast_prefill.max_seqs - len(plan.fast_prefill)
        return self._pool.prompts_to_draft(spare, chunks) if spare > 0 and chunks > 0 else []

    def _deliver_early(self, events: dict[int, list[int]], deliver: Deliver) -> None:
        """``step(deliver=...)``'s call: the tokens committed so far, then none left in ``events`` (cleared only
        once ``deliver`` returned: if it raises they stay, for the next step to report)."""
        self._deliver(events)  # stream() requests' tokens to their streams first, as at the end of a step
        if events:
            deliver({rid: list(tokens) for rid, tokens in events.items()})  # lists of its own: events' may grow
            events.clear()

    def _deliver(self, events: dict[int, list[int]]) -> None:
        """Move the tokens of stream() requests from ``events`` to their streams' queues."""
        for rid in [rid for rid in events if rid in self._owners]:
            queue = self._owners[rid].tokens
            if queue is not None:
                queue.append((rid, events.pop(rid)))

    def stream(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams] | None = None
               ) -> Iterator[tuple[int, list[int]]]:
        """Submit ``prompts`` and yield (index, newly committed tokens) as they commit.

        The index is the position in ``generate``'s result list: the prompt's index when every
        ``n`` is 1; with ``n`` samples, a prompt's samples take consecutive indices.
        Every committed token reaches the stream, also when another caller steps the
        generator. When the consumer stops early (``close()``, ``break``, an exception) the
        stream's unfinished requests are aborted; its Completions are not kept.
        """
        owner = _Owner(is_stream=True)
        rids = self._submit_owned(prompts, params, owner)
        index = {rid: i for i, rid in enumerate(rids)}
        try:
            while True:
                with self._lock:
                    if not owner.tokens and not self._all_finished(rids):
                        self.step()
                    ready = list(owner.tokens)
                    owner.tokens.clear()
                    is_done = not ready and self._all_finished(rids)
                for rid, tokens in ready:  # never yield holding the lock
                    yield index[rid], tokens
                if is_done:
                    return
        finally:
            self._release_owned(rids)

    def generate(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[Completion]:
        """Run ``prompts`` to completion; results come back in the order of ``prompts``.

        A prompt whose params have ``n > 1`` gives its n Completions one after another, sample 0 first.
        Interrupted (KeyboardInterrupt, any exception), it aborts its unfinished requests.
        """
        rids = self._submit_owned(prompts, params, _Owner(is_stream=False))
        try:
            while True:
                with self._lock:
                    if self._all_finished(rids):
                        return [self._pool.finished[rid] for rid in rids]
                    self.step()
        finally:
            self._release_owned(rids)

    def _all_finished(self, rids: list[int]) -> bool:
        finished = self._pool.finished
        return all(rid in finished for rid in rids)

    def _submit_owned(self, prompts: Sequence, params, owner: _Owner) -> list[int]:
        with self._lock:
            if self._is_closed:
                raise RuntimeError("this DVRGenerator is closed")
            rids = self._submit_all(prompts, params)
            self._owners.update(dict.fromkeys(rids, owner))
            return rids

    def _release_owned(self, rids: list[int]) -> None:
        """A generate()/stream() call is over: abort what it left unfinished and forget its Completions."""
        with self._lock:
            try:
                if not self._is_closed:
                    for rid in rids:
                        self._stop(rid)
            finally:
                for rid in rids:
                    self._owners.pop(rid, None)
                    self._pool.finished.pop(rid, None)

    def _submit_all(self, prompts: Sequence, params) -> list[int]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of prompts (token-id lists or strings)")
        params_list = self._params_list(params, len(prompts))
        # validate everything before queueing anything
        encoded = [self._encode(p) for p in prompts]
        for ids, p in zip(encoded, params_list):
            self._check(ids, p)
        return [rid for ids, p in zip(encoded, params_list) for rid in self._enqueue(ids, p)]

    def _params_list(self, params, num: int) -> list[SamplingParams]:
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            return [params] * num
        if not isinstance(params, Sequence) or isinstance(params, (str, bytes)):
            raise TypeError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
        params_list = list(params)
        if len(params_list) != num:
            raise ValueError(f"params has {len(params_list)} entries for {num} prompts")
        for p in params_list:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params must be a SamplingParams, got {type(p).__name__}")
        return params_list

    # -- RL and evaluation ------------------------------------------------------------------------
    @_serialised
    def score(self, prompts: Sequence, completions: Sequence[Sequence[int]],
              params: SamplingParams | Sequence[SamplingParams] | None = None, *,
              return_top_logprobs: bool = False):
        """The canonical log-prob of every completion token given its prompt and the tokens before it.

        Bit-identical to ``Completion.logprobs`` of a ``deterministic=True`` generation that committed
        that completion (same weights, canonical config and ``logprobs_mode``), whatever else is scored
        with it and however it is chunked: prompt and completion are prefilled through the canonical
        pass, batched and chunked into its R rows, with canonical prefixes from the prefix cache.
        ``params``: one SamplingParams or one per prompt; its ``logprobs_mode`` picks raw or processed
        log-probs and its temperature / top_k / top_p define the processed distribution (seed,
        ``n`` and the length fields play no part). Requests may be running meanwhile: their state is
        untouched. Returns one list of floats per completion (empty for an empty completion).

        ``return_top_logprobs=True`` (with ``params.logprobs = N``) returns ``(logprobs, top_logprobs)``:
        also per completion token its N most likely tokens ({id: log-prob}, most likely first), equal
        to ``Completion.top_logprobs`` of that deterministic generation.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of prompts (token-id lists or strings)")
        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise TypeError("completions must be a list of token-id lists, one per prompt")
        if len(completions) != len(prompts):
            raise ValueError(f"completions has {len(completions)} entries for {len(prompts)} prompts")
        params_list = self._params_list(params, len(prompts))
        if not isinstance(return_top_logprobs, bool):
            raise TypeError(f"return_top_logprobs must be a bool, got {type(return_top_logprobs).__name__}")
        if return_top_logprobs and not all(p.num_top_logprobs for p in params_list):
            raise ValueError("return_top_logprobs=True needs params.logprobs = N (an int >= 1) for every prompt")
        canonical_pass = getattr(self.verifier, "canonical_pass", None)
        if canonical_pass is None:
            raise TypeError(f"score() needs the library Verifier's canonical pass; "
                            f"verifier {type(self.verifier).__name__} has no canonical_pass")
        jobs = []
        for prompt, completion, p in zip(prompts, completions, params_list):
            ids = self._encode(prompt)
            tokens = self._check_completion(completion)
            self._check(ids, dataclasses.replace(p, max_new_tokens=max(1, len(tokens))))
            jobs.append(ScoreJob(-1, ids + tokens, len(ids), p, 0))
        while self.passes.oldest is not None:  # its static buffers are the ones scoring uses
            self.passes.apply_oldest(self._events)
            self._deliver(self._events)
        for job in jobs:
            job.rid = self._num_ids
            self._num_ids += 1
        counts = score_jobs(canonical_pass, self.kv, jobs)
        for name, value in counts.items():
            self.stats[name] += value
        if return_top_logprobs:
            return [job.logprobs for job in jobs], [job.top_logprobs for job in jobs]
        return [job.logprobs for job in jobs]

    def _check_completion(self, completion) -> list[int]:
        if isinstance(completion, (str, bytes)) or not isinstance(completion, Sequence):
            raise TypeError(f"a completion must be a list of token ids, got {type(completion).__name__}")
        tokens = list(completion)
        for token in tokens:
            if not isinstance(token, int) or isinstance(token, bool):
                raise TypeError(f"completion token ids must be ints, got {token!r}")
            if not 0 <= token < self.cfg.vocab_size:
                raise ValueError(f"completion token id {token} is outside the vocabulary [0, {self.cfg.vocab_size})")
        return tokens

    @_serialised
    def update_weights(self, weights, *, strict: bool = True) -> None:
        """Copy new weights into this generator's weight tensors, in place (the shapes stay).

        ``weights``: a state dict with Hugging Face names (e.g. a trainer's ``model.state_dict()``),
        in the generator's dtype (TypeError naming the tensor otherwise), or a checkpoint path as
        ``from_pretrained`` takes (cast to the generator's dtype). ``strict=False`` lets a state dict
        name only some tensors. Everything is checked before anything is copied. Drops the prefix
        cache (its K/V came from the old weights); the CPU canonical pass's weight slices are keyed
        on the tensors' versions and so recompute; CUDA graphs keep reading the same buffers.
        Refused while requests are unfinished. Afterwards, deterministic output equals that of a fresh
        generator built from the new weights.
        """
        if self.weights.tp is not None:
            raise ValueError("update_weights() is not supported under tensor parallelism (tensor_parallel > 1)")
        if self.has_unfinished():
            raise RuntimeError("update_weights() while requests are unfinished: let them finish first")
        drop_prefix_cache = getattr(self.kv, "drop_prefix_cache", None)
        if drop_prefix_cache is None:
            raise TypeError(f"update_weights() needs a K/V store with drop_prefix_cache(); "
                            f"{type(self.kv).__name__} has none")
        if isinstance(weights, (str, Path)):
            tensors = load_state_dict(weights, self.cfg, dtype=self.weights.dtype, device=self.device)
        else:
            tensors = check_state_dict(weights, self.cfg, dtype=self.weights.dtype, strict=strict)
        self._drain()
        views = weight_views(self.cfg, self.weights)
        with torch.inference_mode() if self.weights.embed.is_inference() else torch.no_grad():
            for name, tensor in tensors.items():
                views[name].copy_(tensor)
        drop_prefix_cache()

    @_serialised
    def capture_graphs(self) -> dict[str, int]:
        """Capture every CUDA graph the engine replays, now, instead of the first time each is needed; the number
        newly captured per kind (``decode``, ``prefill``, ``mixed``, ``canonical``). A no-op off CUDA or without graphs.

        The fast path captures a graph per (batch bucket, sampling variant) lazily, the mixed step one per (decode
        bucket, prompt bucket, variant), and the canonical pass all of its buckets at its first pass: each capture
        synchronises the device and stalls every running request for tens of milliseconds, which a server would see
        in its latency tail for as long as new shapes keep coming. With ``tune_decode_buckets`` it then times the
        decode buckets (``FastStep.tune_decode_buckets``). Where the mixed step's graphs do not fit in the memory
        the K/V store left, it warns and drops them (``FastStep.drop_mixed``: steps with decode rows and prompt
        chunks then run as two passes; ``stats["mixed_dropped"]``). ``llm42 serve`` calls this at start-up, as a
        serving engine captures its graphs before it takes requests. Only on an idle generator (no request running,
        nothing in flight): the captures run on padding rows, whose K/V goes to the scratch block, never a
        request's; ``RuntimeError`` otherwise. Committed bits are unchanged (a graph replays what it captured).
        """
        if self._pool.running or self.fast_step.in_flight is not None or self.passes.oldest is not None:
            raise RuntimeError("capture_graphs needs an idle generator: call it before submitting requests, or "
                               "once every request has finished")
        fast = self.fast_step
        counts = {"decode": fast.capture_decode(), "prefill": fast.capture_prefill()}
        try:
            counts["mixed"] = fast.capture_mixed()
        except torch.OutOfMemoryError as exc:  # the engine serves on with two passes (``FastStep.drop_mixed``)
            fast.drop_mixed(exc)
            counts["mixed"] = 0
        if self.config.tune_decode_buckets:
            fast.tune_decode_buckets()
        canonical_pass = getattr(self.verifier, "canonical_pass", None)
        is_graphed = canonical_pass is not None and canonical_pass.is_graphed
        counts["canonical"] = canonical_pass.bind(self.kv) if is_graphed else 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return counts

    def _drain(self) -> None:
        """Apply the fast step and canonical pass still in flight (no request runs: nothing is committed)."""
        self.fast_step.read(self.fast_step.take(), self._events, self._finish)
        self.passes.drain(self._events)

    # -- life cycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Abort every request and drop the device memory this generator holds (idempotent).

        Waits for work in flight on the device, frees every request's K/V, and releases the
        K/V store, the decode state, captured graphs and the weights' references, so the
        memory returns without waiting for the garbage collector. Every later call raises.
        """
        with self._lock:
            if self._is_closed:
                return
            try:
                while self.passes.oldest is not None:
                    try:  # apply it (its commits are kept); one that failed is dropped, the rest still closes
                        self.passes.apply_oldest(self._events)
                    except Exception:  # noqa: BLE001 - close must free everything whatever the pass did
                        pass
                for rid in [r.rid for r in self._pool.waiting] + list(self._pool.running):
                    self._stop(rid)
                in_flight = self.fast_step.take()
                if in_flight is not None:
                    in_flight.wait()
                self._pool.retry_frees(self.kv)
            finally:
                close_pass = getattr(getattr(self.verifier, "canonical_pass", None), "close", None)
                if callable(close_pass):  # a CPU pass's worker thread (canonical_thread=True), its graphs and rows
                    close_pass()
                if self._owns_kv:  # the K/V goes now, even where a cycle through a wrapper still holds the store
                    self.kv.release()
                self._is_closed = True
                self._pool.finished.clear()
                self._owners.clear()
                self._events = {}
                self.kv = self.decode_state = self.fast_step = self.passes = self._finish = None
                self.verifier = self.runner = self.weights = None

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    def __enter__(self) -> "DVRGenerator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- engine internals -----------------------------------------------------------------------
    def _admit(self) -> None:
        for req in self._pool.admit(self.kv, self._num_steps):
            self.decode_state.admit(req.slot, req.rid, req.params, req.seed)

    # -- helpers for tests and tools -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def _committed(self, rid: int, of_finished, of_running) -> list:
        """``of_finished(Completion)`` or ``of_running(Request)`` for ``rid``; [] while it waits."""
        state = self._state_of(rid)
        if state == "finished":
            return list(of_finished(self._pool.finished[rid]) or ())
        if state == "running":
            return list(of_running(self._pool.running[rid]))
        if state == "waiting":
            return []
        raise KeyError(f"the Completion of request {rid} was already taken")

    @_serialised
    def committed_tokens(self, rid: int) -> list[int]:
        """Tokens committed so far for a running or finished (not yet taken) request."""
        return self._committed(rid, lambda c: c.token_ids, lambda r: r.token_ids)

    @_serialised
    def committed_logprobs(self, rid: int) -> list[float]:
        """Log-probs of the tokens committed so far (as ``committed_tokens``; also without ``logprobs=True``)."""
        return self._committed(rid, lambda c: c.logprobs, lambda r: r.logprobs)

    @_serialised
    def committed_top_logprobs(self, rid: int) -> list[dict[int, float]]:
        """With ``logprobs=N``: the top-N alternatives of each token committed so far (else [])."""
        def of_running(req: Request) -> list[dict[int, float]]:
            num_top = req.params.num_top_logprobs
            return [dict(list(top.items())[:num_top]) for top in req.top_logprobs] if num_top else []

        return self._committed(rid, lambda c: c.top_logprobs, of_running)


__all__ = ["DVRGenerator"]
