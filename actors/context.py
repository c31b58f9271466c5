"""The episode's token-exact conversation and its context window (head+tail truncation).

A step is a block: gen_prompt + answer ids (+ a closing eos when the answer hit the length
limit) + the observation message. The context shown to the model at step k is
    prompt + blocks[0:k] + gen_prompt
or, when that exceeds max_input_tokens = max_context_len - max_new_tokens,
    prompt + head blocks (≈head_ratio of the budget) + one omission marker + tail blocks + gen_prompt
where the tail always ends with the newest block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from actors.encoding import ChatEncoder


def head_tail(lengths: list[int], budget: float, head_ratio: float) -> tuple[int, int]:
    """The head+tail rule over items of these lengths: items [0, head) fill at most head_ratio of
    the budget (never the newest), items [tail_start, n) the rest from the newest backwards;
    the items between are omitted. tail_start == n: not even the newest item fits."""
    n = len(lengths)
    head, used = 0, 0
    while head < n - 1 and used + lengths[head] <= head_ratio * budget:
        used += lengths[head]
        head += 1
    tail_start, tail_used = n, 0
    while tail_start > head and tail_used + lengths[tail_start - 1] <= budget - used:
        tail_start -= 1
        tail_used += lengths[tail_start]
    return head, tail_start


class ContextExceeded(Exception):
    """Even the prompt and the newest step do not fit the window."""


@dataclass
class Block:
    gen_prompt: list[int]
    answer: list[int]
    logprobs: list[float]
    closing: list[int] = field(default_factory=list)   # eos we appended after a length stop (mask 0)
    observation: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.gen_prompt) + len(self.answer) + len(self.closing) + len(self.observation)

    def ids(self) -> list[int]:
        return self.gen_prompt + self.answer + self.closing + self.observation


@dataclass
class ContextView:
    ids: list[int]
    n_omitted: int          # blocks left out (0 = the whole history)
    head: int               # blocks kept at the head


class TokenConversation:
    def __init__(self, encoder: ChatEncoder, system: str, instance: str,
                 marker: Callable[[int], str]) -> None:
        self.enc = encoder
        self.prompt = encoder.prompt(system, instance)
        self.blocks: list[Block] = []
        self._marker = marker

    def add_answer(self, ids: list[int], logprobs: list[float], stopped: bool) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} logprobs")
        # An answer cut by the length limit is closed with the eos (not trained on) so the
        # next message renders as the template expects.
        closing = [] if (stopped and ids and ids[-1] == self.enc.eos_id) else [self.enc.eos_id]
        self.blocks.append(Block(self.enc.gen_prompt, list(ids), list(logprobs), closing))

    def add_observation(self, text: str) -> None:
        self.blocks[-1].observation = self.enc.user_after_assistant(text)

    def full_ids(self) -> list[int]:
        out = list(self.prompt)
        for b in self.blocks:
            out += b.ids()
        return out

    def context(self, max_input_tokens: int, head_ratio: float = 0.3,
                manage: bool = True) -> ContextView:
        gp = self.enc.gen_prompt
        total = len(self.prompt) + sum(len(b) for b in self.blocks) + len(gp)
        if total <= max_input_tokens:
            return ContextView(self.full_ids() + gp, 0, len(self.blocks))
        if not manage or not self.blocks:
            raise ContextExceeded(f"context {total} > {max_input_tokens} tokens")
        n = len(self.blocks)
        marker = self.enc.user_after_user(self._marker(n))  # widest count: a safe length bound
        avail = max_input_tokens - len(self.prompt) - len(gp) - len(marker)
        head, tail_start = head_tail([len(b) for b in self.blocks], avail, head_ratio)
        if tail_start == n:
            raise ContextExceeded(f"the newest step alone ({len(self.blocks[-1])} tokens) does "
                                  f"not fit the prompt budget of {max_input_tokens}")
        n_omitted = tail_start - head
        ids = list(self.prompt)
        for b in self.blocks[:head]:
            ids += b.ids()
        if n_omitted:
            ids += self.enc.user_after_user(self._marker(n_omitted))
        for b in self.blocks[tail_start:]:
            ids += b.ids()
        return ContextView(ids + gp, n_omitted, head)
