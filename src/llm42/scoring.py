"""Scoring: the canonical log-probs of given completions, computed by canonical passes.

A deterministic request's committed log-prob of the token at position q comes from a
canonical-pass row at position q - 1 whose K/V (positions 0..q-1) is canonical, so it is a
function of tokens[0..q] alone (invariants 2 and 3). Scoring prefills prompt + completion
through the same canonical pass — R rows, chunked and batched with other sequences, from
the prefix cache where a canonical prefix is indexed — and takes each row's log-prob of the
*given* next token, which is therefore bit-identical to what a generation that committed
that completion returned.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llm42.params import SamplingParams
from llm42.runner import Segment


@dataclass
class ScoreJob:
    """One (prompt, completion) pair to score; ``rid`` is a K/V store id no request uses."""

    rid: int
    tokens: list[int]  # prompt + completion
    num_prompt_tokens: int
    params: SamplingParams
    seed: int
    num_prefilled: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # with params.logprobs = N

    @property
    def num_inputs(self) -> int:
        """Positions fed in: every token but the last, which is only scored."""
        return len(self.tokens) - 1


def score_jobs(canonical_pass, kv, jobs: list[ScoreJob]) -> dict[str, int]:
    """Fill each job's ``logprobs`` (one per completion token); returns counts for the generator's stats.

    Jobs are admitted while the K/V store has room beside what running requests reserved; each
    pass packs chunks of the admitted jobs into its R rows, oldest first. A job's full canonical
    blocks are indexed in the prefix cache when it finishes. On an error every job's K/V is freed.
    """
    waiting = deque(job for job in jobs if job.num_inputs >= job.num_prompt_tokens)
    active: list[ScoreJob] = []
    num_passes = 0
    try:
        while waiting or active:
            while waiting:
                job = waiting[0]
                prefix = kv.match_prefix(job.tokens[: job.num_prompt_tokens - 1])  # logits wanted from there
                if not kv.can_allocate(job.num_inputs, prefix):
                    break
                waiting.popleft()
                kv.allocate(job.rid, job.num_inputs, prefix)
                job.num_prefilled = len(prefix) * kv.block_size
                active.append(job)
            if not active:
                raise RuntimeError(
                    f"the K/V store has no room to score a sequence of {len(waiting[0].tokens)} tokens beside "
                    "the running requests' reservations; score when fewer requests run"
                )
            _run_pass(canonical_pass, kv, active)
            num_passes += 1
            for job in [j for j in active if j.num_prefilled == j.num_inputs]:
                kv.publish(job.rid, job.tokens[: job.num_inputs])
                kv.free(job.rid)
                active.remove(job)
    finally:
        for job in active:
            kv.free(job.rid)
    return {"score_passes": num_passes, "scored_tokens": sum(len(j.logprobs) for j in jobs)}


def _run_pass(canonical_pass, kv, active: list[ScoreJob]) -> None:
    rows_left = canonical_pass.num_rows
    scheduled, per_row, targets = [], [], []
    for job in active:
        if rows_left == 0:
            break
        start = job.num_prefilled
        end = min(job.num_inputs, start + rows_left)
        seg = Segment(job.rid, tuple(job.tokens[start:end]), start, job.params, job.seed)
        kv.append(job.rid, end)
        scheduled.append((job, seg))
        per_row += [(job.params, job.seed, pos + 1) for pos in range(start, end)]
        targets += job.tokens[start + 1: end + 1]  # the row at position p scores the token at p + 1
        rows_left -= end - start
    segments = [seg for _, seg in scheduled]
    result = canonical_pass.launch(segments, kv, per_row, targets=targets)
    _, logprobs = result.wait()
    tops = result.top_logprobs()  # None unless some job asked for logprobs = N
    row = 0
    for job, seg in scheduled:
        first_scored = max(seg.start, job.num_prompt_tokens - 1)  # rows before it predict prompt tokens
        rows = slice(row + first_scored - seg.start, row + len(seg.tokens))
        job.logprobs += logprobs[rows]
        if tops is not None and job.params.num_top_logprobs:
            job.top_logprobs += [dict(list(top.items())[: job.params.num_top_logprobs]) for top in tops[rows]]
        row += len(seg.tokens)
        job.num_prefilled = seg.end
        kv.mark_canonical(job.rid, seg.end)
