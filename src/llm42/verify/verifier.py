"""The Verifier: runs the canonical pass over verify windows and prompt chunks, then commits/rolls back."""

from __future__ import annotations

from dataclasses import dataclass

from llm42.kv_store import KVStoreProtocol
from llm42.policies.base import ReductionPolicy
from llm42.runner import ModelRunner, Segment
from llm42.verify.windows import CanonicalConfig, Commit, commit_window


@dataclass(frozen=True)
class CanonicalWork:
    """One request's rows in a canonical pass.

    A verify window (``is_prefill=False``): the last committed token plus its
    candidates. A prompt chunk (``is_prefill=True``): prompt tokens; when
    ``is_last_chunk`` the last row's canonical token is the first output token.
    """

    segment: Segment
    is_prefill: bool
    is_last_chunk: bool = False


class Verifier:
    """Runs canonical passes of exactly R rows with a shape-closed policy."""

    def __init__(self, runner: ModelRunner, policy: ReductionPolicy, config: CanonicalConfig):
        if not getattr(policy, "is_shape_closed", False):
            raise ValueError(f"canonical_policy {policy!r} is not shape-closed (is_shape_closed is not True)")
        self.runner = runner
        self.policy = policy
        self.config = config

    def verify(self, work: list[CanonicalWork], kv: KVStoreProtocol) -> list[Commit]:
        """One canonical pass: compute, then commit or roll back each request's rows."""
        num_rows = self.config.num_rows
        segments = [w.segment for w in work]
        for seg in segments:
            kv.append(seg.rid, seg.end)
        inputs = self.runner.canonical_inputs(segments, kv, num_rows)
        per_row = [(seg.params, seg.seed, pos + 1) for seg in segments for pos in range(seg.start, seg.end)]
        out = self.runner.run(inputs, kv, self.policy, self.runner.sampling_rows(per_row, num_rows))

        commits = []
        row = 0
        for w in work:
            seg = w.segment
            sampled = out.tokens[row: row + len(seg.tokens)]
            logprobs = out.logprobs[row: row + len(seg.tokens)]
            row += len(seg.tokens)
            if w.is_prefill:
                last = (sampled[-1],) if w.is_last_chunk else ()
                commit = Commit(seg.rid, last, tuple(logprobs[-1:]) if last else (), 0, 0, seg.end, True)
            else:
                commit = commit_window(seg, sampled, logprobs)
            kv.truncate(seg.rid, commit.num_kv_valid)
            kv.mark_canonical(seg.rid, commit.num_kv_valid)
            commits.append(commit)
        return commits
