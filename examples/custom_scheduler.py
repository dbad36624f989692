"""A user-written scheduler: free traffic first, verification deferred under load but never starved.

llm42's engine asks its scheduler one question per step — "what runs now?" —
through the one-method ``Scheduler`` protocol::

    def schedule(self, state: SchedulerState) -> Plan: ...

``state`` is a read-only snapshot (every running request as a ``RequestView``,
plus T, G and the fast-step budget); the ``Plan`` names a fast decode batch,
fast prompt chunks, verify windows and canonical prompt chunks. The engine
checks every plan with ``validate_plan`` before running it, so a scheduler can
make requests wait, but cannot corrupt them — and because committed tokens do
not depend on when or with whom a request is verified, *any* valid plan keeps
the determinism contract.

``PriorityScheduler`` below trades a little latency of deterministic requests
for throughput of free ones when the engine is busy:

- Free (``deterministic=False``) requests always get their fast step first.
- Under load (at least ``busy_threshold`` free requests running) a canonical
  pass runs only when it is worth a full pass (``group`` windows are due) or
  when some deterministic request has waited ``max_deferral`` steps. A request
  whose window is full cannot draft further, so it simply waits meanwhile.
- Off load it verifies as soon as any window is due, like the default.
- Never starving: waiting requests are served oldest-wait first, and once one
  is overdue a canonical pass runs every step until it is served.

Run it: ``python examples/custom_scheduler.py`` (CPU, a few seconds).
"""

from __future__ import annotations

from llm42 import DVRGenerator, Plan, PrefillChunk, RequestView, SamplingParams, SchedulerState, fast_prefill_chunks
from llm42.policies import NoisyFastPolicy


class PriorityScheduler:
    """Free requests first; verification batched under load, each wait bounded by ``max_deferral`` steps."""

    def __init__(self, *, busy_threshold: int = 4, max_deferral: int = 4):
        for name, value in (("busy_threshold", busy_threshold), ("max_deferral", max_deferral)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.busy_threshold = busy_threshold
        self.max_deferral = max_deferral
        # rid -> engine step at which the request began waiting for a canonical pass
        self._waiting_since: dict[int, int] = {}

    @staticmethod
    def _needs_canonical(v: RequestView) -> bool:
        """A full verify window, or a deterministic prompt not yet prefilled."""
        return v.is_ready_to_verify or (v.is_deterministic and v.is_prefill)

    def schedule(self, state: SchedulerState) -> Plan:
        waiting = [v for v in state.requests if self._needs_canonical(v)]
        # keep the wait of requests still waiting; finished requests drop out
        self._waiting_since = {v.rid: self._waiting_since.get(v.rid, state.step) for v in waiting}

        verify, canonical_prefill = [], []
        if self._should_verify(state, waiting):
            verify, canonical_prefill = self._canonical_work(state, waiting)

        # free decoders first, then deterministic requests that may still draft
        in_canonical = set(verify)
        decoders = [v for v in state.requests if not v.is_prefill and v.rid not in in_canonical]
        free = [v.rid for v in decoders if not v.is_deterministic]
        drafting = [v.rid for v in decoders if v.is_deterministic and v.num_speculable > 0]
        fast_decode = (free + drafting)[: state.max_fast_tokens]
        fast_prefill = fast_prefill_chunks(state, state.max_fast_tokens - len(fast_decode))

        plan = Plan(tuple(fast_decode), tuple(fast_prefill), tuple(verify), tuple(canonical_prefill))
        if plan.is_empty and waiting:
            # nothing else can run: verify now rather than stall the engine
            verify, canonical_prefill = self._canonical_work(state, waiting)
            plan = Plan(verify=tuple(verify), canonical_prefill=tuple(canonical_prefill))
        for rid in (*plan.verify, *(c.rid for c in plan.canonical_prefill)):
            self._waiting_since.pop(rid, None)  # served: a later wait starts afresh
        return plan

    def _should_verify(self, state: SchedulerState, waiting: list[RequestView]) -> bool:
        if not waiting:
            return False
        num_free = sum(not v.is_deterministic for v in state.requests)
        if num_free < self.busy_threshold:
            return True
        num_due = sum(v.is_ready_to_verify for v in waiting)
        is_overdue = any(state.step - self._waiting_since[v.rid] >= self.max_deferral for v in waiting)
        return num_due >= state.group or is_overdue

    def _canonical_work(self, state: SchedulerState, waiting: list[RequestView]
                        ) -> tuple[list[int], list[PrefillChunk]]:
        """Fill one canonical pass: longest-waiting first, then partial windows, within G windows and R rows."""
        rows_left = state.num_canonical_rows
        verify: list[int] = []
        canonical_prefill: list[PrefillChunk] = []
        by_wait = sorted(waiting, key=lambda v: (self._waiting_since[v.rid], v.arrival))
        partial = [v for v in state.requests if v.is_deterministic and not v.is_prefill
                   and not v.is_ready_to_verify and v.num_candidates > 0]
        for v in by_wait + partial:
            if v.is_prefill:
                if rows_left > 0:
                    n = min(v.num_prompt_remaining, rows_left)
                    canonical_prefill.append(PrefillChunk(v.rid, n))
                    rows_left -= n
            elif len(verify) < state.group and 1 + v.num_candidates <= rows_left:
                verify.append(v.rid)
                rows_left -= 1 + v.num_candidates
        return verify, canonical_prefill


def main() -> None:
    det = SamplingParams(max_new_tokens=20, temperature=0.8, seed=5, deterministic=True, logprobs=True)
    free = SamplingParams(max_new_tokens=20, temperature=0.7)
    prompts = ["Once upon a time", "The cat sat", "Tom had a red ball", "One day, a bird", "Mom said", "The sun"]
    params = [det, free, free, det, free, free]

    # the batch-size-1 reference, with the default scheduler and fast path
    reference = DVRGenerator.from_pretrained(window=8, group=2)
    alone = {i: reference.generate([prompts[i]], p)[0] for i, p in enumerate(params) if p.deterministic}

    # the same traffic with the custom scheduler and a fast path that diverges on purpose (the noise
    # also roughens the free requests' text: they have no canonical pass to repair them)
    scheduler = PriorityScheduler(busy_threshold=2, max_deferral=3)
    gen = DVRGenerator.from_pretrained(window=8, group=2, scheduler=scheduler,
                                       fast_policy=NoisyFastPolicy(scale=0.3, seed=1))
    outs = gen.generate(prompts, params)
    for i, out in enumerate(outs):
        kind = "deterministic" if params[i].deterministic else "free"
        print(f"[{kind:13s}] {prompts[i]!r} -> {out.text!r}")
    for i, ref in alone.items():
        same = outs[i].token_ids == ref.token_ids and outs[i].logprobs == ref.logprobs
        print(f"request {i}: identical to its batch-size-1 reference: {same} "
              f"(rollbacks {outs[i].num_rollbacks}, recomputed tokens {outs[i].num_recomputed})")
        if not same:
            raise SystemExit(1)
    print("stats:", gen.stats)


if __name__ == "__main__":
    main()
