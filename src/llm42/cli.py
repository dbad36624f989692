"""The ``llm42`` command line (also ``python -m llm42``).

Subcommands:

- ``generate``: run prompts through a checkpoint, one JSON line per prompt;
- ``demo``: show on the embedded model that deterministic requests give the
  same tokens alone, inside random batches, and under a noisy fast path;
- ``check``: the same determinism check for any checkpoint and settings;
  exit status 1 when a deterministic request diverges;
- ``serve``: an OpenAI-compatible HTTP API (``llm42.server``, the ``serve`` extra);
- ``convert``: write a GGUF file as a Hugging Face safetensors directory;
- ``bench``: the benchmark harness (``llm42.bench``), on the GPU where there is one;
- ``doctor``: check on this device the premises the contract rests on (``llm42.doctor``);
  exit status 1 naming the op and shape that breaks one.

Bad input (a missing checkpoint, an out-of-range flag) prints one error line
and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from llm42.defaults import default_canonical_size
from llm42.engine.config import EngineConfig
from llm42.generator import DVRGenerator
from llm42.model.gguf import convert_gguf
from llm42.model.loader import Checkpoint, embedded_model_path, load_checkpoint
from llm42.params import Completion, SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.prompts import has_chat_template
from llm42.scheduler import ADMISSIONS, DEFAULT_ORDER, ORDERS, DefaultScheduler
from llm42.testing.harness import describe, filler_prompts, random_token_prompts, run_random_batches, stat_line

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE = 0, 1, 2

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CHECK_PROMPTS = ("Once upon a time", "The weather today is", "She opened the box and found")


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


# -- argument parsing -------------------------------------------------------------------------------
def _device(value: str) -> str:
    try:
        torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"invalid device {value!r} ({exc})") from None
    return value


def _add_model_args(p: argparse.ArgumentParser, *, window: int | None = None, group: int | None = None,
                    threads: int | None = None, with_model: bool = True) -> None:
    if with_model:
        p.add_argument("--model", "-m", metavar="PATH", default=None,
                       help="Hugging Face checkpoint directory, .gguf file, or directory holding one .gguf "
                            "(default: the embedded stories260K model)")
    p.add_argument("--device", type=_device, default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None,
                   help="weight dtype (default: float32 on the CPU, bfloat16 on CUDA)")
    cpu_window, cpu_group = default_canonical_size("cpu")
    cuda_window, cuda_group = default_canonical_size("cuda")
    p.add_argument("--window", type=int, default=window,
                   help="T, tokens per request per canonical pass (default: " + (
                       str(window) if window is not None else f"{cpu_window} on the CPU, {cuda_window} on CUDA") + ")")
    p.add_argument("--group", type=int, default=group,
                   help="G, requests per canonical pass; R = T * G rows (default: " + (
                       str(group) if group is not None else f"{cpu_group} on the CPU, {cuda_group} on CUDA") + ")")
    p.add_argument("--threads", type=int, default=threads,
                   help="CPU intra-op threads (default: " + ("torch's" if threads is None else str(threads))
                        + "; small models run fastest on 1)")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                   help="longest prompt + output a request may have; sizes the K/V default, RoPE and block "
                        "tables (default: the model's context, capped by the K/V store)")
    p.add_argument("--canonical-thread", action="store_true",
                   help="CPU: run canonical passes on a worker thread, so free requests keep decoding while "
                        "one runs (committed output is unchanged)")


def _add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt texts")
    p.add_argument("--file", "-f", metavar="FILE",
                   help="read prompts from FILE, one per line ('-' = stdin; blank lines are skipped)")
    p.add_argument("--token-ids", action="store_true",
                   help="prompts are token ids separated by spaces or commas (for checkpoints without a tokenizer)")
    p.add_argument("--chat", action="store_true",
                   help="send each prompt as a user message through the model's chat template (instruct models)")


def _add_sampling_args(p: argparse.ArgumentParser, *, max_new_tokens: int) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                   help=f"tokens to generate per prompt (default: {max_new_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off (default: 1)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (used when temperature > 0)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's end-of-sequence token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm42",
        description="Bit-reproducible LLM generation under dynamic batching (decode-verify-rollback).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--no-progress", action="store_true",
                        help="never show progress bars (they are shown only when stderr is a terminal)")

    gen = sub.add_parser("generate", parents=[common], help="generate text; one JSON line per prompt on stdout",
                         description="Generate from prompts; prints one JSON object per prompt, in order.")
    _add_prompt_args(gen)
    _add_model_args(gen)
    _add_engine_args(gen)
    _add_sampling_args(gen, max_new_tokens=64)
    gen.add_argument("--deterministic", action="store_true",
                     help="bit-reproducible output (verified by the canonical pass)")
    gen.add_argument("--logprobs", action="store_true", help="include each generated token's log-prob")
    gen.set_defaults(handler=_cmd_generate)

    demo = sub.add_parser("demo", parents=[common], help="show determinism under batching on the embedded model",
                          description="Runs deterministic prompts alone, inside random batches with "
                                      "non-deterministic filler traffic and staggered arrivals, and under a "
                                      "noisy fast path; all runs must give identical tokens and log-probs.")
    _add_model_args(demo, window=8, group=4, with_model=False)
    demo.add_argument("--model", "-m", metavar="PATH", default=None,
                      help="run the demo on this checkpoint (HF directory or GGUF) with chat prompts "
                           "(default: the embedded stories260K model, story prompts)")
    demo.add_argument("--num-batches", type=int, default=3, help="random batches per phase (default: 3)")
    demo.add_argument("--max-new-tokens", type=int, default=40, help="tokens per request (default: 40)")
    demo.add_argument("--noise-scale", type=float, default=0.3, metavar="SCALE",
                      help="NoisyFastPolicy scale for the forced-divergence phase (default: 0.3)")
    demo.add_argument("--seed", type=int, default=0, help="seed for the random batches (default: 0)")
    demo.set_defaults(handler=_cmd_demo)

    check = sub.add_parser("check", parents=[common], help="check that a checkpoint's deterministic output survives batching",
                           description="Runs the prompts alone (the reference) and inside N random batches "
                                       "with filler traffic; reports every divergence. Exit status 1 if any.")
    _add_prompt_args(check)
    _add_model_args(check)
    _add_sampling_args(check, max_new_tokens=32)
    check.add_argument("--num-batches", type=int, default=4, help="random batches (default: 4)")
    check.add_argument("--noisy", action="store_true",
                       help="batched runs use NoisyFastPolicy, a fast path that is wrong on purpose, to force rollbacks")
    check.add_argument("--noise-scale", type=float, default=1.0, metavar="SCALE",
                       help="NoisyFastPolicy scale for --noisy: noise in units of each row's logit std (default: 1.0)")
    check.add_argument("--batch-seed", type=int, default=0, help="seed for the random batches (default: 0)")
    check.set_defaults(handler=_cmd_check)

    doctor = sub.add_parser("doctor", help="check on this device the premises the determinism contract rests on",
                            description="Checks that each canonical-pass op gives a row the same bits wherever it "
                                        "sits among the R rows and whatever the other rows hold, and that a second "
                                        "process computes the same canonical pass; reports fast-path drift for "
                                        "information. Exit status 1 naming the op and shape that breaks a premise.")
    _add_model_args(doctor)
    doctor.add_argument("--json", metavar="FILE", help="also write the full report as JSON to FILE")
    doctor.add_argument("--seed", type=int, default=0, help="seed for the probe rows and fillers (default: 0)")
    doctor.set_defaults(handler=_cmd_doctor)

    serve = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (needs the 'serve' extra)",
                           description="Serves /v1/completions, /v1/chat/completions (streaming or not), /v1/models, "
                                       "/health and /metrics on one engine loop; every request may ask for "
                                       "'deterministic': true. See docs/serving.md.")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--api-key", metavar="KEY", default=None,
                       help="require 'Authorization: Bearer KEY' on every /v1 request (401 otherwise)")
    serve.add_argument("--served-model-name", metavar="NAME", default=None,
                       help="the model id /v1/models lists and answers carry (default: the checkpoint's name)")
    serve.add_argument("--max-pending", type=int, default=1024,
                       help="requests the engine holds, queued or running; beyond it: HTTP 429 (default: 1024)")
    serve.add_argument("--max-num-seqs", type=int, default=256, help="requests decoded at once (default: 256)")
    serve.add_argument("--order", choices=ORDERS, default=DEFAULT_ORDER,
                       help="who is served first where a step's rows are short: 'arrival' (oldest first), "
                            "'budget' (the largest max_tokens left first: faster with deterministic traffic, "
                            "but a short request may wait behind long ones under sustained overload) or "
                            "'canonical_budget' (the budget order for canonical passes only, free requests by "
                            f"arrival; docs/serving.md) (default: {DEFAULT_ORDER})")
    serve.add_argument("--age-bound", type=int, default=None, metavar="N",
                       help="with a budget --order: a request admitted N admissions or more before the newest "
                            "running one is served before younger ones, oldest first, so sustained overload cannot "
                            "keep a short request behind longer ones forever (default: no bound)")
    serve.add_argument("--admission", choices=ADMISSIONS, default="arrival",
                       help="who is admitted first where seats or K/V are short: 'arrival' (oldest first) or "
                            "'budget' (the largest max_tokens first; bound the wait with --max-wait-steps) "
                            "(default: arrival)")
    serve.add_argument("--max-wait-steps", type=int, default=None,
                       help="with --admission budget: a request queued this many engine steps is admitted next, "
                            "ahead of larger budgets (default: no bound)")
    serve.add_argument("--canonical-slices", type=int, default=1, metavar="N",
                       help="run each canonical pass's layers in N slices, one an engine step, so free requests' "
                            "steps share the device with a slice of a pass at a time (at most the model's layers; "
                            "not with --canonical-thread; not measured on a GPU yet) (default: 1, the whole pass)")
    serve.add_argument("--canonical-sms", type=int, default=None, metavar="N",
                       help="CUDA: run the canonical pass on a green context of N SMs, so free requests' steps keep "
                            "the rest of the device: free requests' inter-token gaps nearer nondet's, deterministic "
                            "requests served later (round 42 on an H100, dvr@50: N = 32 gave free ITL p50 1.13x "
                            "nondet's online against 1.19x, and offline throughput 0.61 of nondet's against 0.75; "
                            "docs/serving.md) (default: every SM)")
    serve.add_argument("--canonical-sms-max-rows", type=int, default=None, metavar="ROWS",
                       help="with --canonical-sms: confine only passes of at most ROWS rows (their graph bucket's); "
                            "a wider pass, filled by a backlog of deterministic work, takes every SM (at least the "
                            "pass's R = window x group) (default: every pass confined)")
    _add_engine_args(serve)
    serve.add_argument("--max-n", type=int, default=16, help="largest n (samples per prompt) (default: 16)")
    serve.add_argument("--max-tokens", type=int, default=None,
                       help="largest max_tokens a request may ask for (default: the model's context)")
    serve.add_argument("--max-prompt-tokens", type=int, default=None,
                       help="longest prompt in tokens (default: the model's context)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20,
                       help="largest request body; beyond it: HTTP 413 (default: 1 MiB)")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="seconds in-flight requests may finish after SIGINT/SIGTERM before they are aborted "
                            "(default: 30)")
    serve.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                       help="uvicorn's log level (default: info)")
    serve.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                       help="leave the objects of start-up (torch, the model, the engine) in the cyclic garbage "
                            "collector's full passes (default: frozen while serving, so those pauses are short)")
    serve.add_argument("--no-capture-graphs", dest="capture_graphs", action="store_false",
                       help="capture each CUDA graph the first time a step needs it, mid-serving (default: all at "
                            "start-up, DVRGenerator.capture_graphs, so no request waits for a capture)")
    serve.set_defaults(handler=_cmd_serve)

    convert = sub.add_parser("convert", help="write a GGUF file as a Hugging Face safetensors directory",
                             description="Dequantizes SRC (through transformers' GGUF support) and writes DST_DIR: "
                                         "config.json, model.safetensors, generation_config.json and the tokenizer "
                                         "files. Loading DST_DIR is much faster than parsing the GGUF file.")
    convert.add_argument("src", metavar="SRC.gguf", help="the GGUF file")
    convert.add_argument("dst", metavar="DST_DIR", help="the directory to write (must not exist or be empty)")
    convert.add_argument("--dtype", choices=sorted(_DTYPES), default="float32",
                         help="dtype of the written weights (default: float32)")
    convert.set_defaults(handler=_cmd_convert)

    # every argument after "bench" (--help included) belongs to the harness; see main()
    bench = sub.add_parser("bench", add_help=False, help="run the benchmark harness (figures need a GPU); "
                           "its arguments follow, 'llm42 bench --help' lists them")
    bench.set_defaults(handler=_cmd_bench)
    return parser


# -- shared helpers ---------------------------------------------------------------------------------
def _read_prompts(args: argparse.Namespace) -> list:
    prompts = list(args.prompts)
    if args.file is not None:
        try:
            if args.file == "-":
                lines = sys.stdin.read().splitlines()
            else:
                lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise CLIError(f"cannot read prompt file {args.file!r}: {exc.strerror or exc}") from None
        prompts += [line for line in lines if line.strip()]
    if args.token_ids:
        if args.chat:
            raise CLIError("--chat and --token-ids exclude each other: chat prompts are texts")
        prompts = [_parse_token_ids(p) for p in prompts]
    elif args.chat:
        prompts = [_user_message(p) for p in prompts]
    return prompts


def _user_message(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _check_chat(args: argparse.Namespace, command: str, gen: DVRGenerator, prompts: Sequence) -> None:
    """--chat needs a chat template; an instruct model given raw text gets a one-line note."""
    has_template = has_chat_template(gen.tokenizer)
    if args.chat and not has_template:
        raise CLIError("--chat: this model's tokenizer has no chat template")
    if not args.chat and has_template and any(isinstance(p, str) for p in prompts):
        print(f"llm42 {command}: note: this model has a chat template; raw prompts are sent as plain text "
              "(pass --chat to send them as user messages)", file=sys.stderr)


def _parse_token_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise CLIError(f"--token-ids: {text!r} is not a list of integers") from None


def _params(**fields) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except (ValueError, TypeError) as exc:  # the message names the field
        raise CLIError(str(exc)) from None


def _sampling_params(args: argparse.Namespace, **overrides) -> SamplingParams:
    fields = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
              "top_p": args.top_p, "seed": args.seed, "ignore_eos": args.ignore_eos}
    return _params(**fields, **overrides)


class _Loader:
    """Builds generators over one checkpoint, loaded once (weights are immutable, so they are shared)."""

    def __init__(self, args: argparse.Namespace, path: str | None):
        self.path = embedded_model_path() if path is None else Path(path)
        self.device = torch.device(args.device)
        self.dtype = None if args.dtype is None else _DTYPES[args.dtype]
        self.window = args.window
        self.group = args.group
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise CLIError(f"--device {args.device}: CUDA is not available on this machine")
        self._checkpoint: Checkpoint | None = None

    def __call__(self, **kwargs) -> DVRGenerator:
        """A generator with these engine knobs; ``max_model_len`` also sizes the loaded RoPE tables
        (the first call's loads the checkpoint)."""
        try:
            EngineConfig.of_knobs(kwargs)
            if self._checkpoint is None:
                dtype = self.dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
                self._checkpoint = load_checkpoint(self.path, dtype=dtype, device=self.device,
                                                   num_positions=kwargs.get("max_model_len"))
            ck = self._checkpoint
            return DVRGenerator(ck.weights, ck.cfg, tokenizer=ck.tokenizer, window=self.window, group=self.group,
                                **kwargs)
        except (ValueError, TypeError, OSError) as exc:
            # CheckpointError and UnsupportedModelError are ValueErrors naming what is wrong
            raise CLIError(str(exc)) from None


def _submit(gen: DVRGenerator, prompt, params: SamplingParams) -> int:
    if isinstance(prompt, str) and gen.tokenizer is None:
        raise CLIError("this checkpoint has no tokenizer: pass prompts as token ids with --token-ids")
    try:
        return gen.submit(prompt, params)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"prompt {_short(prompt)}: {exc}") from None


def _short(prompt, limit: int = 40) -> str:
    if isinstance(prompt, str):
        text = prompt
    elif prompt and isinstance(prompt[0], dict):  # chat messages
        text = " / ".join(str(m.get("content", "")) for m in prompt)
    else:
        text = " ".join(map(str, prompt))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _progress(args: argparse.Namespace, desc: str, total: int) -> tqdm:
    # disable=None: only on a terminal, so pipes and captured output stay clean
    return tqdm(total=total, desc=desc, unit="tok", file=sys.stderr, leave=False,
                disable=True if args.no_progress else None, dynamic_ncols=True)


def _run(gen: DVRGenerator, prompts: Sequence, params: Sequence[SamplingParams], bar: tqdm) -> list[Completion]:
    """Submit every prompt (bad input is a CLIError), step until all finish; completions in prompt order."""
    rids = [_submit(gen, prompt, p) for prompt, p in zip(prompts, params)]
    pending = set(rids)
    while pending:
        for rid, tokens in gen.step().items():
            bar.update(len(tokens))
            if rid in pending and gen.is_finished(rid):
                pending.discard(rid)
    outs = [gen.result(rid) for rid in rids]
    _settle(bar, params, outs)
    return outs


def _settle(bar: tqdm, params: Sequence[SamplingParams], outs: Sequence[Completion]) -> None:
    """Take the tokens that requests which stopped early will never produce off the bar's total."""
    unused = sum(p.max_new_tokens - len(c.token_ids) for p, c in zip(params, outs))
    if unused and bar.total is not None:
        bar.total -= unused
        bar.refresh()


# -- generate ---------------------------------------------------------------------------------------
def _cmd_generate(args: argparse.Namespace) -> int:
    prompts = _read_prompts(args)
    if not prompts:
        raise CLIError("no prompts: give them as arguments or with --file")
    params = _sampling_params(args, deterministic=args.deterministic, logprobs=args.logprobs)
    gen = _Loader(args, args.model)(max_model_len=args.max_model_len, canonical_thread=args.canonical_thread)
    _check_chat(args, "generate", gen, prompts)
    with _progress(args, "generate", params.max_new_tokens * len(prompts)) as bar:
        outs = _run(gen, prompts, [params] * len(prompts), bar)
    for prompt, out in zip(prompts, outs):
        record = {
            "prompt": prompt,
            "text": out.text,
            "token_ids": out.token_ids,
            "finish_reason": out.finish_reason,
            "logprobs": out.logprobs,
            "num_rollbacks": out.num_rollbacks,
            "num_recomputed": out.num_recomputed,
        }
        print(json.dumps(record, ensure_ascii=False))
    return EXIT_OK


# -- check, and demo as a preset of it ------------------------------------------------------------
# the demo's three requests (label, sampling fields), and their prompts: stories for the embedded
# model, user messages for an instruct model (--model with a chat template)
_DEMO_SAMPLING = (
    ("greedy", {}),
    ("temperature 0.8, top-p 0.95, seed 7", {"temperature": 0.8, "top_p": 0.95, "seed": 7}),
    ("temperature 1.0, top-k 40, seed 123", {"temperature": 1.0, "top_k": 40, "seed": 123}),
)
_DEMO_STORIES = ("Once upon a time", "The little dog was sad because", "Lily and Ben went to the park")
_DEMO_CHATS = ("What is the capital of France?", "Write a short poem about the sea.",
               "Give me three tips for learning to cook.")


@dataclass(frozen=True)
class _Target:
    prompt: object
    params: SamplingParams
    label: str


@dataclass(frozen=True)
class _Phase:
    """One run of random batches: its name in the stats, a heading, a fast path, the batches' seed."""

    name: str
    heading: str
    fast_policy: object | None
    seed: int


def _run_check(args: argparse.Namespace, loader: _Loader, reference_gen: DVRGenerator, targets: list[_Target],
               phases: list[_Phase], fillers: list) -> int:
    """The determinism check both commands run: references alone, then each phase's random batches."""
    print("\neach deterministic request alone (the batch-size-1 reference)")
    references = []
    with _progress(args, "alone", sum(t.params.max_new_tokens for t in targets)) as bar:
        for target in targets:
            references += _run(reference_gen, [target.prompt], [target.params], bar)
    for i, (target, ref) in enumerate(zip(targets, references)):
        shown = ref.text if ref.text is not None else ref.token_ids
        print(f"  #{i} [{target.label}] {_short(target.prompt, 60)} -> {shown!r}")
    pairs = [(t.prompt, t.params) for t in targets]
    runs, problems = [("alone", reference_gen)], []
    for phase in phases:
        print(f"\n{phase.heading}")
        gen = loader(**({} if phase.fast_policy is None else {"fast_policy": phase.fast_policy}))
        total = args.num_batches * sum(t.params.max_new_tokens for t in targets)
        phase_problems = []
        with _progress(args, phase.name, total) as bar:
            on_step = lambda _, events: bar.update(sum(map(len, events.values())))  # noqa: E731
            for outcome in run_random_batches(gen, pairs, references, fillers, num_batches=args.num_batches,
                                              seed=phase.seed, on_step=on_step):
                batch, delta = outcome.batch, outcome.stats_delta
                lines = [f"batch {outcome.index + 1}, request {t}: {describe(d)}" for t, d in outcome.divergences]
                verdict = "identical" if not lines else f"{len(lines)} MISMATCH(ES)"
                print(f"  batch {outcome.index + 1}: {len(targets)} deterministic + {batch.num_free} free requests "
                      f"arriving over steps 0-{max(batch.schedule)}: {verdict}; rollbacks={delta['rollbacks']}, "
                      f"recomputed={delta['recomputed_tokens']}")
                for line in lines:
                    print(f"    {line}")
                phase_problems += lines
        if not phase_problems:
            print(f"  PASS: {len(targets)} prompt(s) x {args.num_batches} batch(es) matched the reference bit for bit")
        problems += phase_problems
        runs.append((phase.name, gen))
    totals = {k: sum(gen.stats.get(k, 0) for _, gen in runs) for k in runs[0][1].stats}
    print(f"\nstats: {stat_line(totals)}")
    for name, gen in runs:
        print(f"  {name:8s} {stat_line(gen.stats)}")
    if problems:
        print(f"\nFAIL: {len(problems)} deterministic run(s) differ from the batch-size-1 reference")
        return EXIT_DIVERGED
    repaired = sum(gen.stats["rollbacks"] for _, gen in runs[1:])
    print(f"\nPASS: {len(targets)} deterministic requests gave bit-identical tokens and log-probs alone and in "
          f"{len(phases) * args.num_batches} random batches; the fast path's {repaired} rollbacks were all repaired")
    return EXIT_OK


def _check_noise(args: argparse.Namespace) -> None:
    if args.num_batches < 1:
        raise CLIError(f"--num-batches must be >= 1, got {args.num_batches}")
    if not args.noise_scale > 0:
        raise CLIError(f"--noise-scale must be > 0, got {args.noise_scale}")


def _cmd_demo(args: argparse.Namespace) -> int:
    """``check``'s preset: three sampling configurations, then the same batches under a noisy fast path."""
    _check_noise(args)
    if args.model is None and args.threads is None:
        torch.set_num_threads(1)  # the embedded model is tiny: one thread is fastest
    loader = _Loader(args, args.model)
    reference_gen = loader()
    if args.model is not None and reference_gen.tokenizer is None:
        raise CLIError(f"--model {args.model}: the demo needs a checkpoint with a tokenizer")
    is_chat = args.model is not None and has_chat_template(reference_gen.tokenizer)
    targets = [_Target(_user_message(text) if is_chat else text,
                       _params(max_new_tokens=args.max_new_tokens, deterministic=True, logprobs=True, **extra), label)
               for text, (label, extra) in zip(_DEMO_CHATS if is_chat else _DEMO_STORIES, _DEMO_SAMPLING)]
    name = "embedded stories260K" if args.model is None else str(loader.path)
    print(f"llm42 demo: {name} on {args.device}, {'chat' if is_chat else 'story'} prompts; canonical pass "
          f"R = {args.window} x {args.group} = {args.window * args.group} rows")
    phases = [
        _Phase("batched", f"the same requests inside {args.num_batches} random batches (FastPolicy)", None, args.seed),
        _Phase("noisy", f"forced divergence: NoisyFastPolicy(scale={args.noise_scale}) perturbs every fast-path logit",
               NoisyFastPolicy(scale=args.noise_scale, seed=args.seed), args.seed + 1),
    ]
    fillers = filler_prompts(random.Random(args.seed), reference_gen, is_chat=is_chat)
    return _run_check(args, loader, reference_gen, targets, phases, fillers)


def _cmd_check(args: argparse.Namespace) -> int:
    _check_noise(args)
    params = _sampling_params(args, deterministic=True, logprobs=True)
    prompts = _read_prompts(args)
    loader = _Loader(args, args.model)
    reference_gen = loader()
    rng = random.Random(args.batch_seed)
    if not prompts:
        has_tokenizer = reference_gen.tokenizer is not None
        prompts = list(_CHECK_PROMPTS) if has_tokenizer else random_token_prompts(rng, reference_gen, 3)
        if args.chat:
            prompts = [_user_message(p) for p in prompts]
    _check_chat(args, "check", reference_gen, prompts)
    noise = f", NoisyFastPolicy(scale={args.noise_scale})" if args.noisy else ""
    print(f"llm42 check: {loader.path} on {args.device}; {len(prompts)} prompt(s), {args.num_batches} random "
          f"batch(es), R = {args.window} x {args.group} rows{noise}")
    label = f"temperature {params.temperature}" + (f", seed {params.seed}" if params.seed is not None else "")
    policy = NoisyFastPolicy(scale=args.noise_scale, seed=args.batch_seed) if args.noisy else None
    phase = _Phase("noisy" if args.noisy else "batched",
                   f"inside {args.num_batches} random batches ({'NoisyFastPolicy' if args.noisy else 'FastPolicy'})",
                   policy, args.batch_seed + 1)
    targets = [_Target(prompt, params, label) for prompt in prompts]
    return _run_check(args, loader, reference_gen, targets, [phase], filler_prompts(rng, reference_gen))


# -- doctor -----------------------------------------------------------------------------------------
def _cmd_doctor(args: argparse.Namespace) -> int:
    from llm42 import CanonicalConfig, doctor

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device {args.device}: CUDA is not available on this machine")
    try:
        CanonicalConfig(window=args.window, group=args.group)
        model = doctor.load_model(args.model, device=args.device,
                                  dtype=None if args.dtype is None else _DTYPES[args.dtype])
    except (ValueError, TypeError, OSError) as exc:  # bad sizes, CheckpointError, UnsupportedModelError
        raise CLIError(str(exc)) from None
    report = doctor.run_doctor(model, window=args.window, group=args.group, seed=args.seed)
    print(report.format())
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:
            raise CLIError(f"cannot write --json file {args.json!r}: {exc.strerror or exc}") from None
    return EXIT_OK if report.is_ok else EXIT_DIVERGED


# -- serve ------------------------------------------------------------------------------------------
def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from llm42 import server
    except ModuleNotFoundError as exc:
        raise CLIError(f"llm42 serve needs {exc.name!r}, which is not installed (pip install 'llm42[serve]')") from None
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be in [0, 65535], got {args.port}")
    if not args.shutdown_timeout >= 0:
        raise CLIError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.max_pending < 1:
        raise CLIError(f"--max-pending must be >= 1, got {args.max_pending}")
    try:
        limits = server.Limits(max_body_bytes=args.max_body_bytes, max_n=args.max_n, max_tokens=args.max_tokens,
                               max_prompt_tokens=args.max_prompt_tokens)
    except ValueError as exc:
        raise CLIError(str(exc).replace("Limits.", "--").replace("_", "-")) from None
    if args.max_wait_steps is not None and args.admission != "budget":
        raise CLIError("--max-wait-steps needs --admission budget (arrival order admits the oldest first already)")
    if args.max_wait_steps is not None and args.max_wait_steps < 1:
        raise CLIError(f"--max-wait-steps must be >= 1, got {args.max_wait_steps}")
    if args.age_bound is not None and args.order == "arrival":
        raise CLIError("--age-bound bounds the wait a budget --order adds (--order arrival serves the oldest first "
                       "already)")
    if args.age_bound is not None and args.age_bound < 1:
        raise CLIError(f"--age-bound must be >= 1, got {args.age_bound}")
    if args.canonical_slices < 1:
        raise CLIError(f"--canonical-slices must be >= 1, got {args.canonical_slices}")
    if args.canonical_slices > 1 and args.canonical_thread:
        raise CLIError("--canonical-slices runs a pass's slices on later steps: not with --canonical-thread")
    if args.canonical_sms is not None and args.canonical_sms < 1:
        raise CLIError(f"--canonical-sms must be >= 1, got {args.canonical_sms}")
    if args.canonical_sms_max_rows is not None:
        if args.canonical_sms is None:
            raise CLIError("--canonical-sms-max-rows bounds the passes --canonical-sms confines: pass --canonical-sms")
        if args.canonical_sms_max_rows < args.window * args.group:
            raise CLIError(f"--canonical-sms-max-rows must be >= the pass's R = window x group = "
                           f"{args.window * args.group}, got {args.canonical_sms_max_rows}")
    scheduler = DefaultScheduler(order=args.order, admission=args.admission, max_wait_steps=args.max_wait_steps,
                                 age_bound=args.age_bound)
    loader = _Loader(args, args.model)
    gen = loader(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                 canonical_thread=args.canonical_thread, scheduler=scheduler, canonical_slices=args.canonical_slices,
                 canonical_sms=args.canonical_sms, canonical_sms_max_rows=args.canonical_sms_max_rows)
    name = args.served_model_name or (loader.path.stem if loader.path.is_file() else loader.path.name)
    print(f"llm42 serve: {loader.path} on {args.device} as {name!r}; canonical pass R = {args.window} x "
          f"{args.group} rows; http://{args.host}:{args.port}/v1", file=sys.stderr)
    server.serve(gen, host=args.host, port=args.port, model_name=name, api_key=args.api_key, limits=limits,
                 max_pending=args.max_pending, shutdown_timeout=args.shutdown_timeout, log_level=args.log_level,
                 gc_freeze=args.gc_freeze, capture_graphs=args.capture_graphs)
    return EXIT_OK


# -- convert ----------------------------------------------------------------------------------------
def _cmd_convert(args: argparse.Namespace) -> int:
    src, dst = Path(args.src), Path(args.dst)
    if not src.is_file():
        raise CLIError(f"{args.src!r} is not a file")
    try:
        convert_gguf(src, dst, dtype=_DTYPES[args.dtype])
    except (ValueError, TypeError, OSError) as exc:  # CheckpointError / UnsupportedModelError name the file
        raise CLIError(str(exc)) from None
    print(f"wrote {dst} ({args.dtype}) from {src}; load it with DVRGenerator.from_pretrained({str(dst)!r}) "
          f"or --model {dst}")
    return EXIT_OK


# -- bench ------------------------------------------------------------------------------------------
def _find_bench():
    """The benchmark harness's ``main(argv) -> int`` (``llm42.bench.main``), or None where it is not installed."""
    try:
        bench = importlib.import_module("llm42.bench")
    except ModuleNotFoundError as exc:
        if exc.name in ("llm42.bench", "llm42"):
            return None
        raise CLIError(f"the benchmark harness needs {exc.name!r}, which is not installed "
                       "(pip install 'llm42[bench]')") from None
    main = getattr(bench, "main", None)
    return main if callable(main) else None


def _cmd_bench(args: argparse.Namespace) -> int:
    bench_main = _find_bench()
    if bench_main is None:
        raise CLIError("the benchmark harness (llm42.bench) is not part of this installation; benchmarks "
                       "need it and a CUDA GPU (see docs/benchmarks.md)")
    argv = list(args.bench_args)
    is_run = not {"-h", "--help", "--replot"} & {a.split("=")[0] for a in argv}
    if is_run and not any(a == "--device" or a.startswith("--device=") for a in argv):
        # benchmark where the GPU is; without one the harness runs its CPU smoke scale
        if torch.cuda.is_available():
            argv = ["--device", "cuda", *argv]
        else:
            print("llm42 bench: no CUDA device, running the harness on the CPU (a smoke run; the "
                  "benchmark figures need a GPU)", file=sys.stderr)
            argv = ["--device", "cpu", *argv]
    try:
        return int(bench_main(argv) or 0)
    except SystemExit as exc:  # the harness's own argument errors and --help
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return EXIT_USAGE
        return int(exc.code or 0)


# -- entry point ------------------------------------------------------------------------------------
def _resolve_canonical_size(args: argparse.Namespace) -> None:
    """--window/--group left out: the defaults for --device (smaller R on the CPU)."""
    if not hasattr(args, "window"):
        return
    window, group = default_canonical_size(args.device)
    args.window = window if args.window is None else args.window
    args.group = group if args.group is None else args.group


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 divergence found, 2 usage error)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if args.command == "bench":
            args.bench_args = extra
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse exits 2 on bad flags, 0 on --help
        return int(exc.code or 0)
    try:
        _resolve_canonical_size(args)
        if getattr(args, "threads", None) is not None:
            if args.threads < 1:
                raise CLIError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        return args.handler(args)
    except CLIError as exc:
        print(f"llm42 {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
