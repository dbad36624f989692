"""DVRGenerator: the decode–verify–rollback loop that wires model, K/V store, scheduler and verifier.

One ``step()`` reads like the design: schedule -> fast step -> canonical pass
-> commit. Non-deterministic requests commit fast-path tokens directly; a
deterministic request's fast-path tokens are candidates until a canonical
pass commits (or replaces) them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llm42.kv_store import KVStore, KVStoreProtocol
from llm42.model.config import ModelConfig
from llm42.model.loader import embedded_model_path, load_config, load_tokenizer, load_weights
from llm42.model.weights import Weights, random_weights
from llm42.params import Completion, SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.policies.base import ReductionPolicy
from llm42.runner import ModelRunner, Segment
from llm42.scheduler import (
    DefaultScheduler,
    Plan,
    RequestView,
    Scheduler,
    SchedulerState,
    validate_plan,
)
from llm42.verify import CanonicalConfig, CanonicalWork, Commit, Verifier
from llm42.verify.graph import DecodeGraphs, GraphVerifier

_INT64_SPAN = 1 << 64


def _seed_to_int64(seed: int) -> int:
    value = seed % _INT64_SPAN
    return value - _INT64_SPAN if value >= 1 << 63 else value


def _default_kv_tokens(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Room for 16 full-context sequences, capped: on CUDA by half of the memory free after the
    weights, on the CPU by 64K tokens and 2 GiB; never less than one full context."""
    bytes_per_token = 2 * cfg.num_layers * cfg.kv_size * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        cap = free_bytes // 2 // bytes_per_token
    else:
        cap = min(1 << 16, (2 << 30) // bytes_per_token)
    return max(cfg.max_position_embeddings, min(16 * cfg.max_position_embeddings, cap))


@dataclass
class _Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    arrival: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    num_prefilled: int = 0
    num_rollbacks: int = 0
    num_recomputed: int = 0
    finish_reason: str | None = None
    draft_limit: int | None = None  # adaptive speculation depth; None = the full window

    @property
    def is_deterministic(self) -> bool:
        return self.params.deterministic

    @property
    def is_prefill(self) -> bool:
        return self.num_prefilled < len(self.prompt)

    @property
    def num_committed(self) -> int:
        """Prompt plus committed output tokens."""
        return len(self.prompt) + len(self.token_ids)

    @property
    def max_tokens(self) -> int:
        return len(self.prompt) + self.params.max_new_tokens

    def last_token(self) -> int:
        if self.candidates:
            return self.candidates[-1]
        return self.token_ids[-1] if self.token_ids else self.prompt[-1]

    def num_speculable(self, window: int) -> int:
        if not self.is_deterministic:
            return 0
        if self.candidates and self.candidates[-1] in self.stop_ids:
            return 0
        remaining = self.params.max_new_tokens - len(self.token_ids)
        depth = window - 1 if self.draft_limit is None else min(window - 1, self.draft_limit)
        return max(0, min(depth, remaining - 1) - len(self.candidates))

    def adapt_draft_limit(self, commit: Commit, window: int) -> None:
        """Halve the speculation depth after a rollback, double it after a full window is accepted.

        Only when a request drafts and verifies happens changes: the committed tokens do not
        (the contract holds for any verification schedule).
        """
        limit = window - 1 if self.draft_limit is None else self.draft_limit
        if commit.num_rejected:
            self.draft_limit = max(1, limit // 2)
        elif commit.num_accepted >= limit:
            self.draft_limit = min(window - 1, max(1, limit) * 2)


class DVRGenerator:
    """Generation whose ``deterministic=True`` requests are bit-reproducible under dynamic batching.

    Build one with :meth:`from_pretrained` (a Hugging Face checkpoint directory)
    or :meth:`from_config` (seeded random weights). ``window`` (T) and ``group``
    (G) fix the canonical pass at R = T * G rows; committed deterministic output
    is a function of the weights, the prompt, the sampling params and this
    canonical config only. On CUDA (``use_cuda_graphs=True``) the canonical pass
    is replayed from one captured graph and fast decode steps from per-bucket graphs.
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
    ):
        self.canonical_config = CanonicalConfig(window=window, group=group)
        for name, value in (("max_num_seqs", max_num_seqs), ("max_fast_tokens", max_fast_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.cfg = cfg
        self.weights = weights
        self.tokenizer = tokenizer
        self.device = weights.device
        self.max_num_seqs = max_num_seqs
        self.max_fast_tokens = max_fast_tokens
        # speculation depth per request: the full window (default), or halved on rollback and
        # doubled on full acceptance, which wastes fewer candidates when the fast path drifts often
        self.adaptive_draft = bool(adaptive_draft)
        self.runner = ModelRunner(weights, cfg)
        self.fast_policy = fast_policy if fast_policy is not None else FastPolicy()
        self.canonical_policy = canonical_policy if canonical_policy is not None else FixedShapePolicy()
        # on CUDA the canonical pass is one captured graph (the default canonical policy is graph-safe)
        is_graphed = use_cuda_graphs and self.device.type == "cuda"
        is_graph_safe = getattr(self.canonical_policy, "is_graph_safe", False)
        verifier_type = GraphVerifier if is_graphed and is_graph_safe else Verifier
        self.verifier = verifier if verifier is not None else verifier_type(
            self.runner, self.canonical_policy, self.canonical_config
        )
        self.scheduler = scheduler if scheduler is not None else DefaultScheduler()
        if kv_store is None:
            if kv_cache_tokens is None:
                kv_cache_tokens = _default_kv_tokens(cfg, weights.dtype, self.device)
            elif not isinstance(kv_cache_tokens, int) or kv_cache_tokens < 1:
                raise ValueError(f"kv_cache_tokens must be a positive integer, got {kv_cache_tokens!r}")
            kv_store = KVStore(
                cfg,
                num_blocks=-(-kv_cache_tokens // block_size),
                block_size=block_size,
                num_scratch_slots=max(self.canonical_config.num_rows, max_fast_tokens),
                dtype=weights.dtype,
                device=self.device,
                enable_prefix_cache=prefix_cache,
            )
        self.kv = kv_store
        if is_graphed and getattr(self.fast_policy, "is_graph_safe", False):
            self.runner.decode_graphs = DecodeGraphs(
                self.runner, self.fast_policy, self.kv, max_batch_size=min(max_num_seqs, max_fast_tokens)
            )
        self._rng = random.Random(seed)  # seeds for non-deterministic requests that give none
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._waiting: list[_Request] = []
        self._running: dict[int, _Request] = {}
        self._finished: dict[int, Completion] = {}
        self._num_steps = 0
        self._events: dict[int, list[int]] = {}
        self.stats: dict[str, int] = {
            "steps": 0,
            "fast_steps": 0,
            "fast_tokens": 0,
            "canonical_passes": 0,
            "canonical_rows": 0,
            "canonical_rows_used": 0,
            "committed_tokens": 0,
            "accepted_tokens": 0,
            "rollbacks": 0,
            "recomputed_tokens": 0,
            "prefix_cached_tokens": 0,
        }

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        window: int = 32,
        group: int = 8,
        **kwargs,
    ) -> "DVRGenerator":
        """Load a HF checkpoint directory (``None``: the embedded stories260K model)."""
        CanonicalConfig(window=window, group=group)  # reject bad sizes before loading anything
        path = embedded_model_path() if path is None else Path(path)
        device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        cfg = load_config(path)
        weights = load_weights(path, cfg, dtype=dtype, device=device)
        tokenizer = kwargs.pop("tokenizer", None) or load_tokenizer(path)
        return cls(weights, cfg, tokenizer=tokenizer, window=window, group=group, **kwargs)

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
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is a string but this model has no tokenizer; pass token ids")
            prompt = self.tokenizer(prompt)["input_ids"]
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(f"prompt must be a list of token ids or a string, got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise ValueError("prompt is empty")
        for token in prompt:
            if not isinstance(token, int) or isinstance(token, bool):
                raise TypeError(f"prompt token ids must be ints, got {type(token).__name__} {token!r}")
            if not 0 <= token < self.cfg.vocab_size:
                raise ValueError(f"prompt token id {token} is outside [0, {self.cfg.vocab_size})")
        return list(prompt)

    def _check(self, prompt: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        total = len(prompt) + params.max_new_tokens
        if total > self.cfg.max_position_embeddings:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) plus max_new_tokens ({params.max_new_tokens}) exceeds the "
                f"model's context of {self.cfg.max_position_embeddings} tokens"
            )
        capacity = self.kv.num_blocks * self.kv.block_size
        if total > capacity:
            raise ValueError(
                f"prompt plus max_new_tokens ({total} tokens) exceeds the K/V store's {capacity} tokens"
            )

    # -- online API -----------------------------------------------------------------------------
    def submit(self, prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; returns its id. Bad input raises before anything is queued."""
        params = SamplingParams() if params is None else params
        ids = self._encode(prompt)
        self._check(ids, params)
        return self._enqueue(ids, params)

    def _enqueue(self, ids: list[int], params: SamplingParams) -> int:
        if params.seed is not None:
            seed = params.seed
        elif params.deterministic:
            seed = 0
        else:
            seed = self._rng.getrandbits(63)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.cfg.eos_token_ids)
        rid = next(self._ids)
        self._waiting.append(_Request(rid, ids, params, _seed_to_int64(seed), frozenset(stop_ids), -1))
        return rid

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def result(self, rid: int) -> Completion:
        """The Completion of a finished request."""
        if rid in self._finished:
            return self._finished[rid]
        if rid in self._running or any(r.rid == rid for r in self._waiting):
            raise ValueError(f"request {rid} has not finished")
        raise KeyError(f"unknown request id {rid}")

    def step(self) -> dict[int, list[int]]:
        """One engine iteration: schedule -> fast step -> canonical pass -> commit.

        Returns the tokens newly committed in this step, per request id.
        """
        self._admit()
        state = self._scheduler_state()
        plan = self.scheduler.schedule(state)
        validate_plan(plan, state)
        if plan.is_empty and self._running:
            raise RuntimeError(
                f"scheduler {type(self.scheduler).__name__} returned an empty plan with "
                f"{len(self._running)} requests running; no progress is possible"
            )
        # events live on the generator until returned: if a later phase of this step raises,
        # tokens the fast phase already committed are reported by the next successful step
        events = self._events
        self._fast_step(plan, events)
        self._canonical_pass(plan, events)
        self._num_steps += 1
        self.stats["steps"] += 1
        self._events = {}
        return events

    def stream(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams] | None = None
               ) -> Iterator[tuple[int, list[int]]]:
        """Submit ``prompts`` and yield (index into prompts, newly committed tokens) as they commit."""
        rids = self._submit_all(prompts, params)
        index = {rid: i for i, rid in enumerate(rids)}
        pending = set(rids)
        while pending:
            for rid, tokens in self.step().items():
                if rid in index:
                    yield index[rid], tokens
            pending = {rid for rid in pending if rid not in self._finished}

    def generate(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[Completion]:
        """Run ``prompts`` to completion; results come back in the order of ``prompts``."""
        rids = self._submit_all(prompts, params)
        while any(rid not in self._finished for rid in rids):
            self.step()
        return [self._finished.pop(rid) for rid in rids]

    def _submit_all(self, prompts: Sequence, params) -> list[int]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of prompts (token-id lists or strings)")
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params_list = [params] * len(prompts)
        else:
            params_list = list(params)
            if len(params_list) != len(prompts):
                raise ValueError(f"params has {len(params_list)} entries for {len(prompts)} prompts")
        # validate everything before queueing anything
        encoded = [self._encode(p) for p in prompts]
        for ids, p in zip(encoded, params_list):
            self._check(ids, p)
        return [self._enqueue(ids, p) for ids, p in zip(encoded, params_list)]

    # -- engine internals -----------------------------------------------------------------------
    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_num_seqs:
            req = self._waiting[0]
            # reuse canonical K/V of a cached prefix; the last prompt token is always computed,
            # since its row yields the first output token
            prefix = self.kv.match_prefix(req.prompt[:-1])
            if not self.kv.can_allocate(req.max_tokens, prefix):
                break
            self._waiting.pop(0)
            self.kv.allocate(req.rid, req.max_tokens, prefix)
            req.num_prefilled = len(prefix) * self.kv.block_size
            self.stats["prefix_cached_tokens"] += req.num_prefilled
            req.arrival = next(self._arrivals)
            self._running[req.rid] = req

    def _scheduler_state(self) -> SchedulerState:
        window = self.canonical_config.window
        views = tuple(
            RequestView(
                rid=r.rid,
                is_deterministic=r.is_deterministic,
                num_prompt_tokens=len(r.prompt),
                num_prefilled=r.num_prefilled,
                num_generated=len(r.token_ids),
                num_candidates=len(r.candidates),
                num_speculable=r.num_speculable(window),
                arrival=r.arrival,
            )
            for r in sorted(self._running.values(), key=lambda r: r.arrival)
        )
        return SchedulerState(views, window, self.canonical_config.group, self.max_fast_tokens, self._num_steps)

    def _segment(self, req: _Request, tokens: list[int], start: int) -> Segment:
        return Segment(req.rid, tuple(tokens), start, req.params, req.seed)

    def _fast_step(self, plan: Plan, events: dict[int, list[int]]) -> None:
        segments: list[Segment] = []
        for chunk in plan.fast_prefill:
            req = self._running[chunk.rid]
            start = req.num_prefilled
            segments.append(self._segment(req, req.prompt[start: start + chunk.num_tokens], start))
        for rid in plan.fast_decode:
            req = self._running[rid]
            position = req.num_committed + len(req.candidates) - 1
            segments.append(self._segment(req, [req.last_token()], position))
        if not segments:
            return
        for seg in segments:
            self.kv.append(seg.rid, seg.end)
        rows = self.runner.sampling_rows([(s.params, s.seed, s.end) for s in segments], len(segments))
        out = self.runner.run_fast(segments, self.kv, self.fast_policy, rows)
        self.stats["fast_steps"] += 1
        # state changes only after the whole step computed: a failure above leaves requests untouched
        num_prefill = len(plan.fast_prefill)
        for i, seg in enumerate(segments):
            req = self._running[seg.rid]
            if i < num_prefill:
                req.num_prefilled = seg.end
                if req.is_prefill:
                    continue
            self.stats["fast_tokens"] += 1
            token, logprob = out.tokens[i], out.logprobs[i]
            if req.is_deterministic:
                req.candidates.append(token)
            else:
                self._commit_tokens(req, [token], [logprob], events)

    def _canonical_pass(self, plan: Plan, events: dict[int, list[int]]) -> None:
        if not plan.has_canonical_pass:
            return
        work: list[CanonicalWork] = []
        for chunk in plan.canonical_prefill:
            req = self._running[chunk.rid]
            start = req.num_prefilled
            seg = self._segment(req, req.prompt[start: start + chunk.num_tokens], start)
            work.append(CanonicalWork(seg, is_prefill=True, is_last_chunk=seg.end == len(req.prompt)))
        for rid in plan.verify:
            req = self._running[rid]
            window = [self._committed_token(req, req.num_committed - 1)] + req.candidates
            work.append(CanonicalWork(self._segment(req, window, req.num_committed - 1), is_prefill=False))
        commits = self.verifier.verify(work, self.kv)
        self.stats["canonical_passes"] += 1
        self.stats["canonical_rows"] += self.canonical_config.num_rows
        self.stats["canonical_rows_used"] += sum(len(w.segment.tokens) for w in work)
        for commit in commits:
            self._apply_commit(commit, events)

    @staticmethod
    def _committed_token(req: _Request, position: int) -> int:
        return req.prompt[position] if position < len(req.prompt) else req.token_ids[position - len(req.prompt)]

    def _apply_commit(self, commit: Commit, events: dict[int, list[int]]) -> None:
        req = self._running[commit.rid]
        if commit.is_prefill:
            req.num_prefilled = commit.num_kv_valid
        else:
            self.stats["accepted_tokens"] += commit.num_accepted
            if commit.num_rejected:
                req.num_rollbacks += 1
                req.num_recomputed += commit.num_rejected
                self.stats["rollbacks"] += 1
                self.stats["recomputed_tokens"] += commit.num_rejected
            req.candidates.clear()
            if self.adaptive_draft:
                req.adapt_draft_limit(commit, self.canonical_config.window)
        # index the now-canonical full blocks before the request may finish and release them
        self.kv.publish(req.rid, req.prompt + req.token_ids + list(commit.token_ids))
        if commit.token_ids:
            self._commit_tokens(req, list(commit.token_ids), list(commit.logprobs), events)

    def _commit_tokens(self, req: _Request, tokens: list[int], logprobs: list[float],
                       events: dict[int, list[int]]) -> None:
        """Append committed tokens, deciding stops on committed tokens only."""
        accepted: list[int] = []
        for token, logprob in zip(tokens, logprobs):
            req.token_ids.append(token)
            req.logprobs.append(logprob)
            accepted.append(token)
            if token in req.stop_ids:
                req.finish_reason = "stop"
                break
            if len(req.token_ids) >= req.params.max_new_tokens:
                req.finish_reason = "length"
                break
        self.stats["committed_tokens"] += len(accepted)
        events.setdefault(req.rid, []).extend(accepted)
        if req.finish_reason is not None:
            self._finish(req)

    def _finish(self, req: _Request) -> None:
        del self._running[req.rid]
        self.kv.free(req.rid)
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(req.token_ids, skip_special_tokens=True)
        self._finished[req.rid] = Completion(
            request_id=req.rid,
            prompt_token_ids=list(req.prompt),
            token_ids=list(req.token_ids),
            text=text,
            finish_reason=req.finish_reason,
            logprobs=list(req.logprobs) if req.params.logprobs else None,
            num_rollbacks=req.num_rollbacks,
            num_recomputed=req.num_recomputed,
        )

    # -- helpers for tests and tools -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def committed_tokens(self, rid: int) -> list[int]:
        """Tokens committed so far for a running or finished request."""
        if rid in self._finished:
            return list(self._finished[rid].token_ids)
        if rid in self._running:
            return list(self._running[rid].token_ids)
        if any(r.rid == rid for r in self._waiting):
            return []
        raise KeyError(f"unknown request id {rid}")


__all__ = ["DVRGenerator"]
