"""A batch-invariant GEMM for the GPU: a persistent Triton matmul with fixed tiles and no split-K.

This is the GEMM of the peers' approach (Thinking Machines' batch-invariant
ops, SGLang's deterministic mode, vLLM's batch invariance). ``y = x @ w.T (+ b)``
is cut into output tiles ``[BLOCK_M, BLOCK_N]``; each tile is computed by one
program that walks K in ``BLOCK_K`` steps, in order, into one fp32
accumulator. The tile sizes depend on the dtype and the weight's shape only
(``config_for``: tiles pinned per shape from a sweep on the H200, else the
dtype's) — never on M — and K is never split across programs, so an output
element is accumulated in the same order whatever the batch: a row's result
does not depend on how many rows there are, where the row sits, or what the
other rows hold. cuBLAS, by contrast, picks tiles and split-K from M, which is
why its rows drift with the batch size. The price is speed at small M: no
split-K and no M-specific tuning.

Two kernels, one contract: the masked-pointer kernel, and (a tile config with
``TMA``) the same tiles, visiting order and K walk with x and w read through
Hopper's TMA descriptors, which the 8B shape's pinned tiles use on the H200
(their bits differ from the pointer kernel's: each config is its own numerics).

``M`` is excluded from Triton's integer specialisation (``do_not_specialize``)
so one compiled kernel serves every batch size: a batch of one row does not
get a differently specialised (and differently scheduled) binary.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Tile sizes per dtype. Treated as part of the numerics: another tile may change the bits (another BLOCK_K does
# in Triton's interpreter; on the H200 none of the TMA kernel's schedules measured in round 21 did).
_CONFIGS = {
    torch.bfloat16: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
    torch.float16: dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8),
    torch.float32: dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_stages=2, num_warps=4),
}


def _tiles(block_m: int, block_n: int, stages: int, warps: int, per_sm: int = 1, *, block_k: int = 64,
           tma: bool = False, flatten: bool = False, store: str = "pointer") -> dict:
    config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_stages=stages, num_warps=warps,
                  PROGRAMS_PER_SM=per_sm)
    if tma:
        config.update(TMA=True, FLATTEN=flatten, STORE=store)
    return config


# Pinned per weight shape (dtype, N, K) where a sweep on the H200 found faster tiles than the dtype's (time summed
# over the rows swept; benchmarks/device/gemm_config_sweep.py, benchmarks/results/h200_round14/ and round18/). A function
# of the weight's shape only, never of M: a row's bits stay its own at any batch, and a model's GEMM tiles are
# fixed by its weights. PROGRAMS_PER_SM sizes the persistent grid (who computes a tile, not how).
_SHAPE_CONFIGS: dict[tuple[torch.dtype, int, int], dict] = {
    # the Llama-3.1-8B shape: qkv, o, gate_up, down, the output head. Since round 18 through TMA descriptors (the
    # TMA kernel; two sweeps over 256, 1,024 and 2,048 rows, benchmarks/results/h200_round18/gemm_sweep_tma*.json:
    # at 2,048 rows 0.72-0.98x round 14's pointer tiles, 1.06-1.3x one cuBLAS call): other bits than round 14's
    # pins.
    # Since round 21 the layer weights' schedules (tiles, FLATTEN, STORE) from benchmarks/device/gemm_schedule.py
    # (benchmarks/results/h200_round21/): on the H200 every schedule measured gave round 18's bits (tiles, warps,
    # stages, FLATTEN, STORE; BLOCK_K 32 too: the tensor cores' k16 steps accumulate in K order whatever the block),
    # so these keep them (tests/test_batch_invariant.py checks it on the GPU)
    (torch.bfloat16, 6144, 4096): _tiles(128, 256, 3, 8, tma=True, flatten=True),
    (torch.bfloat16, 4096, 4096): _tiles(128, 128, 5, 8, tma=True, flatten=True),
    (torch.bfloat16, 28672, 4096): _tiles(128, 256, 3, 8, tma=True, flatten=True),
    (torch.bfloat16, 4096, 14336): _tiles(128, 256, 3, 8, tma=True, flatten=True, store="tma_halves"),
    (torch.bfloat16, 128256, 4096): _tiles(128, 256, 3, 8, tma=True),
    # SmolLM2-135M, since round 25 from benchmarks/device/gemm_graph_sweep.py: each candidate timed inside a CUDA
    # graph, as a canonical pass replays it (round 14's eager sweep saw only launch time on these shapes: 30-70 us
    # whatever the tiles), over 256, 1,024 and 2,048 rows (benchmarks/results/h200_round25/). On the H200 all 19
    # candidates, pointer and TMA kernels, BLOCK_K 32 and 64, gave round 14's bits on every shape, so these keep
    # them (tests/test_batch_invariant.py checks it on the GPU): qkv, o, gate_up, down, the output head
    (torch.bfloat16, 960, 576): _tiles(128, 64, 3, 4, per_sm=2, tma=True),
    (torch.bfloat16, 576, 576): _tiles(64, 128, 3, 4, per_sm=2, tma=True),
    (torch.bfloat16, 3072, 576): _tiles(128, 128, 3, 8, tma=True),
    (torch.bfloat16, 576, 1536): _tiles(64, 128, 3, 4, per_sm=2, tma=True),
    (torch.bfloat16, 49152, 576): _tiles(128, 256, 3, 8, tma=True),
}
_INTERPRETER_PROGRAMS = 4  # programs in the persistent grid when there is no GPU (Triton's interpreter)


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # The persistent loop's visiting order, grouped along M for L2 reuse: it decides only who computes a tile,
    # never how. Both kernels visit tiles this way.
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % tiles_per_group) % group_rows, (tile % tiles_per_group) // group_rows


@triton.jit
def _store_tile(acc, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, stride_on, HAS_BIAS: tl.constexpr):
    # the epilogue of both kernels: + bias in fp32, rounded once to the output dtype, rows and columns in range only
    n_mask = offs_n < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M", "num_programs"])
def _persistent_matmul_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, num_programs,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_k_steps = tl.cdiv(K, BLOCK_K)
    offs_k0 = tl.arange(0, BLOCK_K)
    # Persistent loop: program p computes tiles p, p + num_programs, ...
    for tile in range(tl.program_id(0), num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, num_k_steps):
            offs_k = step * BLOCK_K + offs_k0
            k_mask = offs_k < K
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                        mask=n_mask[None, :] & k_mask[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        _store_tile(acc, bias_ptr, out_ptr, offs_m, offs_n, M, N, stride_om, stride_on, HAS_BIAS)


@triton.jit(do_not_specialize=["M", "num_programs"])
def _persistent_tma_matmul_kernel(
    x_desc, w_desc, out_desc, bias_ptr, out_ptr,
    M, N, K, num_programs,
    stride_om, stride_on,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FLATTEN: tl.constexpr = False, STORE: tl.constexpr = "pointer",
):
    # The same tiles, visiting order and K walk as _persistent_matmul_kernel, with x and w read through TMA
    # descriptors (Hopper's bulk tensor copies; out-of-range rows and columns arrive as zeros, which add exact
    # zeros to the accumulator) instead of masked pointer loads. A row's bits are still its own at any M: a tile's
    # output element reads its own row of x and the K walk is fixed. Its bits may differ from the pointer kernel's.
    # How the work is scheduled, never what a tile computes (the same bits every way):
    # - FLATTEN: the tile and K loops software-pipelined as one, so the next tile's loads overlap this tile's
    #   epilogue. The epilogue finds its tile from a counter of its own (a value used both before the K loop
    #   and after it does not survive Triton's flattening).
    # - STORE: "pointer" (masked stores), "tma" (the tile through out_desc), "tma_halves" (two [BLOCK_M,
    #   BLOCK_N / 2] halves through out_desc: less shared memory held by the epilogue).
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_k_steps = tl.cdiv(K, BLOCK_K)
    tile_out = tl.program_id(0) - num_programs
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, num_k_steps):
            x = x_desc.load([pid_m * BLOCK_M, step * BLOCK_K])  # [BLOCK_M, BLOCK_K]
            w = w_desc.load([pid_n * BLOCK_N, step * BLOCK_K])  # [BLOCK_N, BLOCK_K]
            acc = tl.dot(x, w.T, acc, input_precision=DOT_PRECISION)
        tile_out += num_programs
        out_m, out_n = _tile_coords(tile_out, num_pid_m, num_pid_n, GROUP_M)
        if STORE == "pointer":
            _store_tile(acc, bias_ptr, out_ptr, out_m * BLOCK_M + tl.arange(0, BLOCK_M),
                        out_n * BLOCK_N + tl.arange(0, BLOCK_N), M, N, stride_om, stride_on, HAS_BIAS)
        else:
            # + bias in fp32 and one rounding, as _store_tile; the descriptor drops rows and columns out of range
            offs_n = out_n * BLOCK_N + tl.arange(0, BLOCK_N)
            if HAS_BIAS:
                acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            if STORE == "tma_halves":
                left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
                out_desc.store([out_m * BLOCK_M, out_n * BLOCK_N], left.to(out_ptr.dtype.element_ty))
                out_desc.store([out_m * BLOCK_M, out_n * BLOCK_N + BLOCK_N // 2], right.to(out_ptr.dtype.element_ty))
            else:
                out_desc.store([out_m * BLOCK_M, out_n * BLOCK_N], acc.to(out_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _capability_of(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _capability(device: torch.device) -> tuple[int, int]:
    return _capability_of(device.index if device.index is not None else torch.cuda.current_device())


def _num_programs(device: torch.device) -> int:
    # one program per SM whatever the shape: a single compiled kernel, and idle programs exit at once
    if device.type == "cuda":
        return _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return _INTERPRETER_PROGRAMS


def config_for(dtype: torch.dtype, num_out: int, k: int) -> dict:
    """The tiles ``matmul`` runs for a [num_out, k] weight of ``dtype``: pinned per shape, else the dtype's."""
    return _SHAPE_CONFIGS.get((dtype, num_out, k), _CONFIGS[dtype])


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           config: dict | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose rows are bit-identical at every batch size.

    x: [..., K]; weight: [N, K]; bias: [N] or None -> [..., N] in x's dtype.
    Accumulates in fp32; fp32 inputs use exact fp32 products (no TF32). ``config`` (BLOCK_M, BLOCK_N, BLOCK_K,
    GROUP_M, num_stages, num_warps and optionally PROGRAMS_PER_SM; TMA: x and w read through TMA descriptors, and
    with it FLATTEN and STORE, how the TMA kernel schedules its loads and stores, never its bits)
    overrides ``config_for``: for sweeps only, since the tiles are part of the bits.
    """
    if x.dtype not in _CONFIGS:
        raise TypeError(f"batch-invariant matmul supports {sorted(str(d) for d in _CONFIGS)}, got {x.dtype}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"x, weight and bias must share one dtype, got {x.dtype}, {weight.dtype}, "
                        f"{None if bias is None else bias.dtype}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be [N, {x.shape[-1]}], got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    num_out, k = weight.shape
    rows = x.reshape(-1, k)  # [M, K]
    out = torch.empty((rows.shape[0], num_out), device=x.device, dtype=x.dtype)
    if rows.shape[0] and num_out:
        launch = dict(config if config is not None else config_for(x.dtype, num_out, k))
        per_sm = launch.pop("PROGRAMS_PER_SM", 1)
        # TMA needs Hopper or newer: elsewhere the same tiles run on pointer loads (a GPU's bits are its own anyway)
        tma = launch.pop("TMA", False) and (x.device.type != "cuda" or _capability(x.device)[0] >= 9)
        num_programs = _num_programs(x.device) * (per_sm if x.device.type == "cuda" else 1)
        common = dict(HAS_BIAS=bias is not None, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                      **launch)
        if tma:
            from triton.tools.tensor_descriptor import TensorDescriptor

            rows = rows.contiguous()  # a descriptor needs unit stride along K and 16-byte aligned rows
            _check_tma(rows, weight)
            x_desc = TensorDescriptor.from_tensor(rows, [launch["BLOCK_M"], launch["BLOCK_K"]])
            w_desc = TensorDescriptor.from_tensor(weight, [launch["BLOCK_N"], launch["BLOCK_K"]])
            store = launch.get("STORE", "pointer")
            if store not in ("pointer", "tma", "tma_halves"):
                raise ValueError(f"config STORE must be 'pointer', 'tma' or 'tma_halves', got {store!r}")
            if store != "pointer" and (num_out * out.element_size()) % 16:
                store = common["STORE"] = "pointer"  # a descriptor needs 16-byte aligned output rows
            out_block = [launch["BLOCK_M"], launch["BLOCK_N"] // (2 if store == "tma_halves" else 1)]
            out_desc = TensorDescriptor.from_tensor(out, out_block) if store != "pointer" else x_desc
            _persistent_tma_matmul_kernel[(num_programs,)](
                x_desc, w_desc, out_desc, bias if bias is not None else weight, out,
                rows.shape[0], num_out, k, num_programs, out.stride(0), out.stride(1), **common)
        else:
            for name in ("FLATTEN", "STORE"):  # the TMA kernel's scheduling options only
                common.pop(name, None)
            _persistent_matmul_kernel[(num_programs,)](
                rows, weight, bias if bias is not None else weight, out,
                rows.shape[0], num_out, k, num_programs,
                rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
                **common)
    return out.view(*x.shape[:-1], num_out)


def _check_tma(rows: torch.Tensor, weight: torch.Tensor) -> None:
    for name, t in (("x", rows), ("weight", weight)):
        if t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"the TMA matmul needs {name} with unit stride along K and 16-byte aligned rows, got "
                             f"strides {tuple(t.stride())}, base address {t.data_ptr() % 16} bytes off a 16-byte "
                             "boundary")


__all__ = ["config_for", "matmul"]
