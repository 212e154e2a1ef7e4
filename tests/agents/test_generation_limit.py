"""AZR's prompt-length rule (``agents.generation.limit.PromptLimit``, ``make_generator(max_prompt_tokens=...)``):
a request whose prompt is over the limit never reaches the backend and comes back as ``n`` empty completions
marked dropped; the others are the backend's, in the contract's order."""

from __future__ import annotations

from agents.generation import Completion, GenerationRequest, HFGenerator, make_generator
from agents.generation.hf import encode_prompt
from agents.generation.limit import DROPPED, PromptLimit, dropped


class Recorder:
    """A backend that records the requests it is asked for and answers each sample with one token."""

    def __init__(self) -> None:
        self.asked: list[list[GenerationRequest]] = []
        self.refreshed: list = []

    def generate(self, requests):
        self.asked.append(list(requests))
        return [Completion(i, k, r.adapter, "x", [1], [7], [-0.5]) for i, r in enumerate(requests) for k in range(r.n)]

    def refresh(self, names=None) -> None:
        self.refreshed.append(names)


def test_long_prompts_are_dropped_before_the_backend(tiny_tokenizer):
    short, long_ = "hi", "word " * 200
    limit = len(encode_prompt(tiny_tokenizer, GenerationRequest("ma", short, chat=False))) + 5
    requests = [GenerationRequest("ma", short, n=2, chat=False), GenerationRequest("mb", long_, n=3, chat=False),
                GenerationRequest("mb", short, n=1, chat=False)]
    backend = Recorder()
    out = PromptLimit(backend, tiny_tokenizer, limit).generate(requests)
    assert [r.prompt for r in backend.asked[0]] == [short, short]  # the long one never reached it
    assert [(c.request_index, c.sample_index) for c in out] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0)]
    gone = [c for c in out if dropped(c)]
    assert [c.request_index for c in gone] == [1, 1, 1]
    for c in gone:
        assert (c.text, c.token_ids, c.logprobs, c.finish_reason, c.adapter) == ("", [], [], "length", "mb")
        assert c.extra == {"dropped": DROPPED, "prompt_tokens": len(c.prompt_token_ids)} and len(c.prompt_token_ids) > limit
    assert all(c.token_ids == [7] for c in out if not dropped(c))
    everything = PromptLimit(backend, tiny_tokenizer, limit).generate([requests[1]] * 2)  # all over: not called
    assert len(backend.asked) == 1 and len(everything) == 6 and all(map(dropped, everything))
    PromptLimit(backend, tiny_tokenizer, limit).refresh(["ma"])
    assert backend.refreshed == [["ma"]]


def test_make_generator_wraps_a_backend_only_with_a_limit(population, tiny_tokenizer):
    pop = population()
    assert isinstance(make_generator("hf", pop, tiny_tokenizer), HFGenerator)
    wrapped = make_generator("hf", pop, tiny_tokenizer, max_prompt_tokens=8, batch_size=4)
    assert isinstance(wrapped, PromptLimit) and wrapped.generator.batch_size == 4 and wrapped.max_prompt_tokens == 8
    out = wrapped.generate([GenerationRequest("ma", "short", max_new_tokens=3, seed=1, chat=False),
                            GenerationRequest("ma", "long " * 50, max_new_tokens=3, seed=1, chat=False)])
    assert not dropped(out[0]) and len(out[0].token_ids) > 0 and dropped(out[1])
