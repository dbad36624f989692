"""SamplingRuns: the sampling parameters of a canonical pass's rows, as runs of rows that share a request's."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingRuns:
    """The sampling parameters of a pass's rows, as runs of consecutive rows that share one request's params and
    seed (a window's rows, a prompt chunk's): run i is ``counts[i]`` rows with ``params[i]`` and ``seeds[i]``;
    ``positions``: each row's sampled token's position. What ``stage`` and the sampler's rows are built from with
    NumPy, per run (a list of (params, seed, position) per row cost ~1 ms of host time a 2,048-row pass)."""

    params: tuple
    seeds: np.ndarray
    counts: np.ndarray
    positions: np.ndarray

    @classmethod
    def of_segments(cls, segments) -> SamplingRuns:
        """One run per segment: its rows sample the tokens at positions ``start + 1 .. end``."""
        n = len(segments)
        counts = np.fromiter((len(seg.tokens) for seg in segments), np.int64, n)
        starts = np.fromiter((seg.start for seg in segments), np.int64, n)
        firsts = np.cumsum(counts) - counts
        positions = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts + 1 - firsts, counts)
        return cls(tuple(seg.params for seg in segments), np.fromiter((seg.seed for seg in segments), np.int64, n),
                   counts, positions)

    @classmethod
    def of_rows(cls, per_row) -> SamplingRuns:
        """From (params, seed, position of the sampled token) per row (None: no rows)."""
        per_row = per_row or []
        heads: list[int] = []  # the first row of each run
        params, seed = None, None
        for i, (p, s, _) in enumerate(per_row):
            if p is not params or s != seed:
                heads.append(i)
                params, seed = p, s
        counts = np.diff(np.array(heads + [len(per_row)], dtype=np.int64))
        return cls(tuple(per_row[i][0] for i in heads), np.array([per_row[i][1] for i in heads], dtype=np.int64),
                   counts, np.array([q for _, _, q in per_row], dtype=np.int64))

    def __len__(self) -> int:
        return self.positions.size

    def take(self, rows: np.ndarray) -> SamplingRuns:
        """The runs of ``rows`` (row indices, in that order)."""
        run_of_row = np.repeat(np.arange(len(self.params), dtype=np.int64), self.counts)[rows]
        if not run_of_row.size:
            return SamplingRuns((), run_of_row, run_of_row, run_of_row)
        heads = np.flatnonzero(np.concatenate(([True], run_of_row[1:] != run_of_row[:-1])))
        runs = run_of_row[heads]
        return SamplingRuns(tuple(self.params[i] for i in runs.tolist()), self.seeds[runs],
                            np.diff(np.append(heads, run_of_row.size)), self.positions[rows])

    def per_run(self, values) -> np.ndarray:
        """``values`` (one per run) repeated over each run's rows."""
        return np.repeat(np.asarray(values), self.counts)
