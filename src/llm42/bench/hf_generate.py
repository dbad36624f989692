"""transformers' own ``generate`` on the same model and request shape: the naive alternative to an engine.

    python -m llm42.bench.hf_generate --model DIR --device cuda --batch 256 --prompt-tokens 128 \\
        --new-tokens 256 --json OUT.json

Greedy, static K/V cache (``cache_implementation="static"``, which transformers
compiles by default; ``--no-compile`` runs it eagerly), every prompt the same
length (no padding), exactly ``new_tokens`` new tokens (``min_new_tokens``). One
warm-up call (full size when compiled: compilation is specialised to the cache
length), then one timed call; output tokens/s = batch x new tokens / its wall
time. Prompts are ``llm42.bench.workloads.fixed_shape``'s, so llm42's run of the
same shape sees the same token ids. Runs in its own process (``serving.py``
starts it with a timeout), so compilation can be cut off.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def _dtype_kwargs(dtype: torch.dtype) -> dict:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def run(model_dir: str, *, device: str, dtype: torch.dtype, batch: int, prompt_tokens: int, new_tokens: int,
        compile: bool, seed: int = 0) -> dict:
    import transformers
    from transformers import AutoModelForCausalLM

    from llm42.bench.workloads import fixed_shape

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, **_dtype_kwargs(dtype)).to(device).eval()
    load_s = time.perf_counter() - started
    workload = fixed_shape(prompt_tokens, new_tokens, batch, length_scale=1.0, vocab_size=model.config.vocab_size,
                           seed=seed, sampled_share=0.0)
    input_ids = torch.tensor([r.prompt for r in workload.requests], device=device)
    kwargs = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  do_sample=False, cache_implementation="static", pad_token_id=0)
    if not compile:
        kwargs["disable_compile"] = True

    def generate(**overrides) -> tuple[float, int]:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, **{**kwargs, **overrides})
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out.shape[1] - input_ids.shape[1]

    # compiled code is specialised to the static cache's length: warm up at the full length; eager, briefly
    warm_s, _ = generate() if compile else generate(max_new_tokens=8, min_new_tokens=8)
    elapsed_s, num_new = generate()
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": model_dir,
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "new_tokens": num_new,
        "cache_implementation": "static",
        "compile": compile,
        "load_s": load_s,
        "warmup_s": warm_s,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": batch * num_new / elapsed_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face checkpoint directory")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None,
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--no-compile", action="store_true", help="generate eagerly (disable_compile=True)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    result = run(args.model, device=args.device, dtype=dtype, batch=args.batch, prompt_tokens=args.prompt_tokens,
                 new_tokens=args.new_tokens, compile=not args.no_compile, seed=args.seed)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
