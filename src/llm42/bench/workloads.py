"""Benchmark workloads: request sets with seeded prompts, lengths and sampling settings.

Two families, as in the LLM-42 paper's evaluation:

- ``sharegpt_like``: ShareGPT-shaped lengths. The dataset itself cannot be
  downloaded here, so input and output lengths are drawn from log-normal
  distributions (``SHAREGPT_INPUT``, ``SHAREGPT_OUTPUT``) chosen to resemble
  its long-tailed shape — median prompt about 150 tokens, median reply about
  200, long tails clipped — not fitted to the data; prompt token ids are random.
- ``fixed_shape``: every request has the same (input, output) length; the
  paper's shapes are ``PAPER_FIXED_SHAPES``.
- ``chat_like``: the ShareGPT-like lengths of ``sharegpt_like`` (same seed,
  same lengths), but each prompt is English text rendered with a real
  model's tokenizer and chat template: a task about a topic, padded with
  context sentences to the drawn input length. A trained model's logits on
  text are what rollback rates depend on; random ids would make them meaningless.

Every length is multiplied by a ``length_scale`` (and rounded, at least 1) so
a whole comparison fits a time budget. Half the requests (``sampled_share``)
sample with a seed; the rest are greedy. Everything is a pure function of the
arguments, so every mode of a run sees the same request set.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

SAMPLED_TEMPERATURE = 0.8
FIRST_TOKEN_ID = 3  # prompts avoid ids 0-2 (pad/bos/eos in Llama-style vocabularies)


@dataclass(frozen=True)
class LogNormal:
    """A log-normal length distribution, clipped to [low, high] before scaling."""

    mu: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return int(min(self.high, max(self.low, round(rng.lognormvariate(self.mu, self.sigma)))))

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    def as_dict(self) -> dict:
        return {"mu": self.mu, "sigma": self.sigma, "low": self.low, "high": self.high,
                "median": round(self.median, 1)}


# ln-space parameters: median e^5.0 ~ 148 prompt tokens, e^5.3 ~ 200 output tokens
SHAREGPT_INPUT = LogNormal(mu=5.0, sigma=1.1, low=4, high=2048)
SHAREGPT_OUTPUT = LogNormal(mu=5.3, sigma=0.9, low=4, high=1024)
PAPER_FIXED_SHAPES: tuple[tuple[int, int], ...] = ((1024, 256), (1024, 1024), (4096, 1024))


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    temperature: float  # 0 = greedy
    seed: int
    top_p: float = 1.0  # 1 = off (``Workload.with_top_p``)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[BenchRequest, ...]
    description: str
    parameters: dict

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def max_total_tokens(self) -> int:
        """The longest request's prompt plus output."""
        return max(len(r.prompt) + r.max_new_tokens for r in self.requests)

    @property
    def num_kv_tokens(self) -> int:
        """K/V positions needed to hold every request at once."""
        return sum(len(r.prompt) + r.max_new_tokens for r in self.requests)

    def head(self, num_requests: int) -> "Workload":
        """The first ``num_requests`` requests (all of them if there are fewer)."""
        if num_requests >= self.num_requests:
            return self
        return Workload(f"{self.name}[:{num_requests}]", self.requests[:num_requests], self.description,
                        self.parameters)

    def with_top_p(self, num_requests: int, top_p: float, *, seed: int = 0) -> "Workload":
        """The same requests, ``num_requests`` of the sampled ones (a seeded choice) with ``top_p``: a step that
        carries one samples it through the top-k / top-p filter. Raises where fewer requests sample."""
        if not 0.0 < top_p < 1.0:
            raise ValueError(f"with_top_p: top_p must be in (0, 1), got {top_p}")
        sampled = [r.index for r in self.requests if not r.is_greedy]
        if not 0 <= num_requests <= len(sampled):
            raise ValueError(f"with_top_p: num_requests must be in [0, {len(sampled)}] (the sampled requests), "
                             f"got {num_requests}")
        chosen = set(random.Random(seed).sample(sampled, num_requests))
        requests = tuple(dataclasses.replace(r, top_p=top_p) if r.index in chosen else r for r in self.requests)
        return Workload(f"{self.name}+top_p", requests, self.description,
                        {**self.parameters, "top_p_requests": num_requests, "top_p": top_p})

    def summary(self) -> dict:
        inputs = [len(r.prompt) for r in self.requests]
        outputs = [r.max_new_tokens for r in self.requests]
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "num_requests": self.num_requests,
            "num_greedy": sum(r.is_greedy for r in self.requests),
            "num_top_p": sum(r.top_p < 1.0 for r in self.requests),
            "input_tokens": {"total": sum(inputs), "mean": sum(inputs) / len(inputs), "max": max(inputs)},
            "output_tokens": {"total": sum(outputs), "mean": sum(outputs) / len(outputs), "max": max(outputs)},
        }


def _scaled(length: int, length_scale: float) -> int:
    return max(1, round(length * length_scale))


def _requests(lengths: list[tuple[int, int]], *, vocab_size: int, seed: int,
              sampled_share: float) -> tuple[BenchRequest, ...]:
    if vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_TOKEN_ID}, got {vocab_size}")
    if not 0.0 <= sampled_share <= 1.0:
        raise ValueError(f"sampled_share must be in [0, 1], got {sampled_share}")
    rng = random.Random(seed)
    requests = []
    for index, (num_input, num_output) in enumerate(lengths):
        prompt = tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(num_input))
        temperature = SAMPLED_TEMPERATURE if rng.random() < sampled_share else 0.0
        requests.append(BenchRequest(index, prompt, num_output, temperature, seed=1000 + index))
    return tuple(requests)


def _check_common(num_requests: int, length_scale: float) -> None:
    if not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive integer, got {num_requests!r}")
    if not length_scale > 0:
        raise ValueError(f"length_scale must be > 0, got {length_scale!r}")


def sharegpt_like(num_requests: int, *, length_scale: float, vocab_size: int, seed: int = 0,
                  sampled_share: float = 0.5) -> Workload:
    """ShareGPT-shaped request lengths (log-normal, see ``SHAREGPT_INPUT`` / ``SHAREGPT_OUTPUT``)."""
    _check_common(num_requests, length_scale)
    rng = random.Random(f"sharegpt-lengths-{seed}")
    lengths = [(_scaled(SHAREGPT_INPUT.sample(rng), length_scale), _scaled(SHAREGPT_OUTPUT.sample(rng), length_scale))
               for _ in range(num_requests)]
    return Workload(
        name="sharegpt",
        requests=_requests(lengths, vocab_size=vocab_size, seed=seed, sampled_share=sampled_share),
        description="ShareGPT-like log-normal input/output lengths, random prompt ids",
        parameters={"input": SHAREGPT_INPUT.as_dict(), "output": SHAREGPT_OUTPUT.as_dict(),
                    "length_scale": length_scale, "sampled_share": sampled_share,
                    "sampled_temperature": SAMPLED_TEMPERATURE, "seed": seed},
    )


def fixed_shape(num_input: int, num_output: int, num_requests: int, *, length_scale: float, vocab_size: int,
                seed: int = 0, sampled_share: float = 0.5) -> Workload:
    """Every request has ``num_input`` prompt and ``num_output`` output tokens (before scaling)."""
    _check_common(num_requests, length_scale)
    scaled = (_scaled(num_input, length_scale), _scaled(num_output, length_scale))
    return Workload(
        name=f"fixed_{num_input}x{num_output}",
        requests=_requests([scaled] * num_requests, vocab_size=vocab_size, seed=seed + num_input + num_output,
                           sampled_share=sampled_share),
        description=f"paper shape (input, output) = ({num_input}, {num_output}), scaled to {scaled}",
        parameters={"input": num_input, "output": num_output, "length_scale": length_scale,
                    "scaled": list(scaled), "sampled_share": sampled_share,
                    "sampled_temperature": SAMPLED_TEMPERATURE, "seed": seed},
    )


_TASKS = (
    "Write a short story about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "List the main advantages and disadvantages of {topic}.",
    "Write a formal email to a colleague about {topic}.",
    "Summarise what you know about {topic} in a few paragraphs.",
    "Give me a step-by-step plan to learn about {topic}.",
    "Write a poem about {topic}.",
    "What are common misconceptions about {topic}?",
    "Describe the history of {topic}.",
    "Answer as a teacher: why does {topic} matter?",
)
_TOPICS = (
    "the water cycle", "black holes", "the French revolution", "machine learning", "coffee farming",
    "the human immune system", "volcanoes", "medieval castles", "electric cars", "honey bees",
    "the stock market", "photosynthesis", "the Roman empire", "climate change", "chess openings",
    "the printing press", "ocean tides", "vaccines", "jazz music", "the moon landing",
)
_CONTEXT = (
    "Keep the answer clear and well organised.",
    "I am preparing notes for a study group next week.",
    "Some of my friends think the topic is boring, but I find it fascinating.",
    "Please avoid jargon where a simple word will do.",
    "I read an article about this yesterday and it left me with more questions than answers.",
    "My teacher said that the details matter more than the big picture, and I am not sure I agree.",
    "Use examples from everyday life if you can.",
    "The audience will be adults with no special background.",
    "I would like to understand the causes as well as the consequences.",
    "Last year I visited a museum that had an exhibition on a related subject.",
    "It would help to mention a few numbers or dates.",
    "If there is a debate among experts, describe both sides fairly.",
    "I have about ten minutes to read your answer.",
    "Please finish with a short summary of the key points.",
    "My grandmother used to tell me stories about this when I was a child.",
    "I want to write a blog post based on what you tell me.",
    "Think about what a curious reader would ask next.",
    "Start with the simplest idea and build up from there.",
)


def chat_like(num_requests: int, *, tokenizer, length_scale: float, vocab_size: int, seed: int = 0,
              sampled_share: float = 0.5) -> Workload:
    """Text prompts (a task about a topic plus context sentences) at ShareGPT-like lengths.

    The input and output lengths are ``sharegpt_like``'s for the same seed; a prompt gets
    context sentences until its rendered length reaches the drawn input length (so it may
    exceed it by one sentence). Rendered with the tokenizer's chat template when it has
    one, else tokenized as plain text.
    """
    from llm42.prompts import has_chat_template, render_chat

    _check_common(num_requests, length_scale)
    if tokenizer is None:
        raise ValueError("chat_like prompts need a tokenizer (random-weight models have none: use sharegpt_like)")
    base = sharegpt_like(num_requests, length_scale=length_scale, vocab_size=vocab_size, seed=seed,
                         sampled_share=sampled_share)
    rng = random.Random(f"chat-text-{seed}")
    is_chat = has_chat_template(tokenizer)
    sentence_len = {c: len(tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in _CONTEXT}

    def encode(text: str) -> tuple[int, ...]:
        if is_chat:
            return tuple(render_chat(tokenizer, [{"role": "user", "content": text}]))
        return tuple(tokenizer(text)["input_ids"])

    requests = []
    for request in base.requests:
        target = len(request.prompt)
        text = rng.choice(_TASKS).format(topic=rng.choice(_TOPICS))
        length = len(encode(text))
        while length < target:
            sentence = rng.choice(_CONTEXT)
            text += " " + sentence
            length += sentence_len[sentence]
        prompt = encode(text)
        if max(prompt) >= vocab_size:
            raise ValueError(f"the tokenizer produced id {max(prompt)}, outside the model's vocabulary {vocab_size}")
        requests.append(BenchRequest(request.index, prompt, request.max_new_tokens, request.temperature,
                                     request.seed, request.top_p))
    return Workload(
        name="chat",
        requests=tuple(requests),
        description="English chat prompts (task + topic + context sentences) at ShareGPT-like lengths",
        parameters={**base.parameters, "chat_template": is_chat},
    )


def poisson_arrivals(num_requests: int, rate_rps: float, *, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process with ``rate_rps`` requests per second."""
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps!r}")
    rng = random.Random(f"arrivals-{seed}-{rate_rps!r}")
    t, times = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(rate_rps)
        times.append(t)
    return times
