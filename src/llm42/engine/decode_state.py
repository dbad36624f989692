"""Device-resident state of the fast path's decode batch, and the decode step over it.

Every running request owns a *slot*: a row of persistent device tensors holding the
token it feeds into its next decode step, that token's position, its block table and its
sampling parameters. A decode step gathers its rows from these tensors on the device,
runs forward + sampler, and scatters the sampled tokens back, so the next step's input
never travels through the host. The host only sends what changed (a request admitted,
a block appended, a canonical commit), batched into a few small copies per step
(``flush``), and reads tokens back asynchronously for bookkeeping.

The same code runs eagerly on the CPU and inside CUDA graphs (``llm42.cuda_graphs``),
so the CPU suite tests the staging the GPU replays.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.weights import Weights
from llm42.policies.base import ReductionPolicy
from llm42.sampler import SamplingRows, logprob_details, sample_with_margins, sampling_variant


class DecodeState:
    """Slots ``0 .. max_num_seqs - 1`` for requests, slot ``max_num_seqs`` for padding rows."""

    def __init__(self, weights: Weights, cfg: ModelConfig, kv, policy: ReductionPolicy, *, max_num_seqs: int,
                 max_model_len: int | None = None):
        """``max_model_len``: the longest sequence (default: the model's context); it sizes the block
        tables and is the context bound the CUDA graphs' attention is captured for."""
        self.weights = weights
        self.cfg = cfg
        self.kv = kv
        self.policy = policy
        self.device = weights.device
        self.max_num_seqs = max_num_seqs
        self.pad_slot = max_num_seqs
        num_slots = max_num_seqs + 1
        self.max_model_len = cfg.max_position_embeddings if max_model_len is None else max_model_len
        self.max_blocks = -(-self.max_model_len // kv.block_size)
        dev = self.device
        self.tokens = torch.zeros(num_slots, dtype=torch.int64, device=dev)  # [S+1] next input token
        self.positions = torch.zeros(num_slots, dtype=torch.int64, device=dev)  # [S+1] its position
        self.tables = torch.full((num_slots, self.max_blocks), kv.scratch_block, dtype=torch.int64, device=dev)
        self.temperature = torch.zeros(num_slots, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(num_slots, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(num_slots, dtype=torch.int64, device=dev)
        self.seeds = torch.zeros(num_slots, dtype=torch.int64, device=dev)
        # per slot: 1 for a deterministic request (its decode rows may take the canonical attention's bits)
        self.is_deterministic = torch.zeros(num_slots, dtype=torch.int8, device=dev)
        # per slot: K/V positions below this hold the canonical pass's writes, which a decode step never
        # overwrites (its write goes to the scratch block; it attends to what is there)
        self.protect = torch.zeros(num_slots, dtype=torch.int64, device=dev)
        self.batch = torch.full((max_num_seqs,), self.pad_slot, dtype=torch.int64, device=dev)  # [B] slots
        self._row_ids = torch.arange(max_num_seqs, device=dev)
        self._is_cuda = dev.type == "cuda"
        # host-side mirrors and queued updates
        self._table_len = [0] * num_slots
        self._next: dict[int, tuple[int | None, int]] = {}
        self._protect: dict[int, int] = {}
        self._params: dict[int, tuple[float, int, float, int, int]] = {}
        self._table_writes: list[tuple[int, int, int]] = []
        # per slot: whether its request samples (temperature > 0), and samples with a filter (top-k / top-p)
        self._is_sampled = np.zeros(num_slots, dtype=bool)
        self._is_filtered = np.zeros(num_slots, dtype=bool)
        self._pinned_batch = torch.zeros(max_num_seqs, dtype=torch.int64, pin_memory=self._is_cuda)
        self._updates = _UpdateStaging(dev)
        self._batch_copied = torch.cuda.Event() if self._is_cuda else None

    # -- host -> device updates -------------------------------------------------------------------
    def admit(self, slot: int, rid: int, params, seed: int) -> None:
        """A request takes ``slot``: its sampling params and (prefix-shared) block table."""
        self._params[slot] = (params.temperature, params.top_k, params.top_p, seed, int(params.deterministic))
        self._protect[slot] = 0
        self._is_sampled[slot], self._is_filtered[slot] = sampling_variant([params])
        self._table_len[slot] = 0
        self.sync_table(slot, rid)

    def release(self, slot: int) -> None:
        self._next.pop(slot, None)
        self._protect.pop(slot, None)
        self._params.pop(slot, None)
        self._table_writes = [w for w in self._table_writes if w[0] != slot]
        self._table_len[slot] = 0
        self._is_sampled[slot] = self._is_filtered[slot] = False

    def set_next(self, slot: int, token: int | None, position: int) -> None:
        """The next decode step of ``slot`` feeds ``token`` (None: the one already on the device) at ``position``."""
        self._next[slot] = (token, position)

    def set_protect(self, slot: int, num_positions: int) -> None:
        """K/V positions ``[0, num_positions)`` of ``slot`` are the canonical pass's: decode steps leave them be.

        A deterministic request drafting ahead of a window in a canonical pass feeds the window's last
        candidate again; its K/V write there would overwrite the pass's (invariant 3). The step attends to
        what the position holds instead: on one stream, the pass's own K/V.
        """
        self._protect[slot] = num_positions

    def sync_table(self, slot: int, rid: int) -> None:
        """Queue the block-table entries of ``rid`` the device does not have yet (after appends or a rollback)."""
        table = self.kv.block_table(rid)
        known = min(self._table_len[slot], len(table))
        self._table_writes.extend((slot, col, table[col]) for col in range(known, len(table)))
        self._table_len[slot] = len(table)

    def ensure_blocks(self, slot: int, rid: int, position: int) -> None:
        """Make the block holding ``position`` addressable in the K/V store and on the device.

        The store is told only when a new block is needed: inside a block, a decode step's
        write needs no accounting (the store's length of a free request may lag by < 1 block).
        """
        if position // self.kv.block_size >= self._table_len[slot]:
            self.kv.append(rid, position + 1)
            self.sync_table(slot, rid)

    def flush(self) -> None:
        """Send every queued update to the device (stream-ordered before the next step) in one copy: the host packs
        them into one pinned buffer (``_UpdateStaging``), the device scatters each field from its part of the copy.
        Before round 39 each list was its own pinned tensor and copy (``to_device``): up to nine a flush after a pass's
        commits, fourteen with admissions (round 39's host profile of dvr@50 on a GPU host: 6,906 in 1,402 steps)."""
        nxt, protect, params, writes = self._next, self._protect, self._params, self._table_writes
        if not (nxt or protect or params or writes):
            return
        with_token = [slot for slot, (token, _) in nxt.items() if token is not None]
        num_next, num_tokens, num_protect, num_params, num_writes = (len(nxt), len(with_token), len(protect),
                                                                    len(params), len(writes))
        num_floats = (num_params + 1) // 2  # int64 entries that hold num_params float32 values
        # the packed layout: (field, entries), in order; the device reads the same spans
        spans = (num_next, num_next, num_tokens, num_tokens, num_protect, num_protect, num_params, num_floats,
                 num_params, num_floats, num_params, num_params, num_writes, num_writes, num_writes)
        ends = list(itertools.accumulate(spans))
        host = self._updates.host(ends[-1])
        if nxt:
            host[0: ends[0]] = list(nxt)
            host[ends[0]: ends[1]] = [position for _, position in nxt.values()]
            host[ends[1]: ends[2]] = with_token
            host[ends[2]: ends[3]] = [nxt[slot][0] for slot in with_token]
        if protect:
            host[ends[3]: ends[4]] = list(protect)
            host[ends[4]: ends[5]] = list(protect.values())
        if params:
            values = list(params.values())
            host[ends[5]: ends[6]] = list(params)
            # float64 -> float32 rounds to nearest, as torch.tensor on the Python floats did
            host[ends[6]: ends[7]].view(np.float32)[:num_params] = [v[0] for v in values]
            host[ends[7]: ends[8]] = [v[1] for v in values]
            host[ends[8]: ends[9]].view(np.float32)[:num_params] = [v[2] for v in values]
            host[ends[9]: ends[10]] = [v[3] for v in values]
            host[ends[10]: ends[11]] = [v[4] for v in values]
        if writes:
            rows, cols, blocks = zip(*writes)
            host[ends[11]: ends[12]] = rows
            host[ends[12]: ends[13]] = cols
            host[ends[13]: ends[14]] = blocks
        dev = self._updates.copy(ends[-1])
        if nxt:
            self.positions.index_copy_(0, dev[0: ends[0]], dev[ends[0]: ends[1]])
            if with_token:
                self.tokens.index_copy_(0, dev[ends[1]: ends[2]], dev[ends[2]: ends[3]])
            nxt.clear()
        if protect:
            self.protect.index_copy_(0, dev[ends[3]: ends[4]], dev[ends[4]: ends[5]])
            protect.clear()
        if params:
            slots = dev[ends[5]: ends[6]]
            self.temperature.index_copy_(0, slots, dev[ends[6]: ends[7]].view(torch.float32)[:num_params])
            self.top_k.index_copy_(0, slots, dev[ends[7]: ends[8]])
            self.top_p.index_copy_(0, slots, dev[ends[8]: ends[9]].view(torch.float32)[:num_params])
            self.seeds.index_copy_(0, slots, dev[ends[9]: ends[10]])
            self.is_deterministic.index_copy_(0, slots, dev[ends[10]: ends[11]].to(torch.int8))
            params.clear()
        if writes:
            self.tables.index_put_((dev[ends[11]: ends[12]], dev[ends[12]: ends[13]]), dev[ends[13]: ends[14]])
            writes.clear()

    def stage_batch(self, slots: list[int], num_rows: int) -> tuple[bool, bool]:
        """Put ``slots`` (padded with the padding slot to ``num_rows``) into the batch buffer; True if any samples."""
        if self._batch_copied is not None:
            self._batch_copied.synchronize()  # the previous step's copy has left the pinned buffer
        host = self._pinned_batch.numpy()
        n = len(slots)
        batch = np.array(slots, dtype=np.int64)
        host[:n] = batch
        host[n:num_rows] = self.pad_slot
        self.batch[:num_rows].copy_(self._pinned_batch[:num_rows], non_blocking=True)
        if self._batch_copied is not None:
            self._batch_copied.record()
        return bool(self._is_sampled[batch].any()), bool(self._is_filtered[batch].any())

    def table_lengths(self) -> list[int]:
        """Per slot, the block-table entries the device has (``ensure_blocks`` appends past them)."""
        return self._table_len

    # -- the decode step (graph-capturable: no host syncs) -----------------------------------------
    def decode(self, num_rows: int, *, variant: tuple[bool, bool], max_context_len: int | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode row per staged slot; returns (tokens [num_rows], values [num_rows]): a free row's value is
        its log-prob, a deterministic row's its draft margin (``draft_values``)."""
        idx, positions, logits, rows = self._forward(num_rows, variant, max_context_len)
        new_tokens, logprobs, margins = sample_with_margins(logits, rows)
        self.advance(idx, positions, new_tokens)
        return new_tokens, self.draft_values(idx, logprobs, margins)

    def draft_values(self, idx: torch.Tensor, logprobs: torch.Tensor, margins: torch.Tensor) -> torch.Tensor:
        """The value each decode row reads back beside its token: a free row's log-prob (committed with it), a
        deterministic row's margin (``llm42.sampler.sample_with_margins``; its fast log-prob is never
        committed, the canonical pass's is). The host closes a window early at a draft of small margin."""
        return torch.where(self.is_deterministic[idx].bool(), margins, logprobs)

    def decode_with_details(self, num_rows: int, *, variant: tuple[bool, bool], max_context_len: int | None,
                            is_processed: torch.Tensor, num_top: int
                            ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``decode`` with log-probs in each row's mode (``is_processed`` [num_rows] bool) and the top
        ``num_top`` alternatives ((ids, log-probs) [num_rows, num_top], None for 0); eager only."""
        idx, positions, logits, rows = self._forward(num_rows, variant, max_context_len)
        new_tokens, _, margins = sample_with_margins(logits, rows)
        logprobs, top_ids, top_logprobs = logprob_details(logits, new_tokens, rows, is_processed, num_top)
        self.advance(idx, positions, new_tokens)
        return new_tokens, self.draft_values(idx, logprobs, margins), (top_ids, top_logprobs) if num_top else None

    def _forward(self, num_rows: int, variant: tuple[bool, bool], max_context_len: int | None):
        idx, positions, inputs = self.decode_inputs(num_rows, max_context_len)
        logits = forward(self.weights, self.cfg, inputs, self.kv.layers(), self.policy)
        return idx, positions, logits, self.sampling_rows(idx, positions, variant)

    def decode_inputs(self, num_rows: int, max_context_len: int | None
                      ) -> tuple[torch.Tensor, torch.Tensor, StepInputs]:
        """(slots [num_rows], positions, ``StepInputs``) of the staged batch's decode rows, gathered on the device."""
        idx = self.batch[:num_rows]
        tokens = self.tokens[idx]
        positions = self.positions[idx]
        tables = self.tables[idx]  # [B, max_blocks]
        bs = self.kv.block_size
        blocks = tables.gather(1, (positions // bs).unsqueeze(1)).squeeze(1)
        blocks = torch.where(positions < self.protect[idx], self.kv.scratch_block, blocks)
        inputs = StepInputs(
            token_ids=tokens,
            positions=positions,
            slot_mapping=blocks * bs + positions % bs,
            row_seq=self._row_ids[:num_rows],
            block_tables=tables,
            context_lens=positions + 1,
            seq_starts=tuple(range(num_rows + 1)),
            # a bound inside graphs (the CUDA kernels size their splits from it at capture)
            max_context_len=self.max_model_len if max_context_len is None else max_context_len,
            logits_rows=None,
            # only for a policy that reads them (a gather per step otherwise spent for nothing)
            deterministic_rows=self.is_deterministic[idx] if getattr(self.policy, "wants_deterministic_rows", False)
            else None,
        )
        return idx, positions, inputs

    def sampling_rows(self, idx: torch.Tensor, positions: torch.Tensor, variant: tuple[bool, bool]) -> SamplingRows:
        """The sampling parameters of the decode rows of slots ``idx`` at ``positions``."""
        return SamplingRows(temperature=self.temperature[idx], top_k=self.top_k[idx], top_p=self.top_p[idx],
                            seeds=self.seeds[idx], positions=positions + 1,
                            is_any_sampled=variant[0], is_any_filtered=variant[1])

    def advance(self, idx: torch.Tensor, positions: torch.Tensor, new_tokens: torch.Tensor) -> None:
        """Feed each slot's sampled token into its next decode step, one position on."""
        self.tokens.index_copy_(0, idx, new_tokens)
        self.positions.index_copy_(0, idx, positions + 1)
        self.tokens[self.pad_slot:].zero_()  # padding rows always read token 0 at position 0
        self.positions[self.pad_slot:].zero_()

    def set_first_tokens(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Feed tokens sampled on the device (a finished prompt's first output) into the next decode step."""
        self.tokens.index_copy_(0, slots, tokens)

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens.clone(), self.positions.clone()

    def restore(self, saved: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.tokens.copy_(saved[0])
        self.positions.copy_(saved[1])


class _UpdateStaging:
    """``DecodeState.flush``'s packed updates: a pinned int64 buffer on CUDA (grown as needed), copied to the
    device asynchronously once a flush; ``host`` waits until the previous copy has left the buffer, so a flush never
    overwrites values still in flight. On the CPU the buffer is the device's own: ``copy`` returns it. Not a
    ``llm42.cuda_graphs.Staging`` (which mirrors one fixed device buffer): the updates' count has no fixed bound, and
    each copy lands in a fresh device tensor allocated on the stream that reads it, so the caching allocator reuses
    it only after that stream's scatters (a flush may run on the step stream of ``prioritize_fast``)."""

    def __init__(self, device: torch.device, capacity: int = 1024):
        self.device = device
        self._is_cuda = device.type == "cuda"
        self._host = torch.zeros(capacity, dtype=torch.int64, pin_memory=self._is_cuda)
        self._copied = torch.cuda.Event() if self._is_cuda else None
        self._is_pending = False

    def host(self, num: int) -> np.ndarray:
        """The first ``num`` entries to write (a NumPy view of the pinned buffer)."""
        if self._is_pending:
            self._copied.synchronize()
            self._is_pending = False
        if num > self._host.numel():
            self._host = torch.zeros(max(num, 2 * self._host.numel()), dtype=torch.int64, pin_memory=self._is_cuda)
        return self._host.numpy()[:num]

    def copy(self, num: int) -> torch.Tensor:
        """The first ``num`` entries on the device (queued after the caller's work on the current stream)."""
        src = self._host[:num]
        if not self._is_cuda:
            return src
        dev = src.to(self.device, non_blocking=True)
        self._copied.record()
        self._is_pending = True
        return dev


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A list on the device without a wait: staged in pinned memory on CUDA (a pageable source makes
    the copy synchronous, and a blocking one waits for every step in flight), then copied asynchronously.
    The caching host allocator keeps the pinned block until the copy is done."""
    is_cuda = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=is_cuda).to(device, non_blocking=True)
