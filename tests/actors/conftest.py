"""Fixtures for the actors' tests: a small ChatML tokenizer built offline (no hub), so the pure
parts need no services; the scripted policy server over two task rows for the service tests."""

from __future__ import annotations

from pathlib import Path

# Imported at collection: hypothesis's pytest plugin otherwise imports (and AST-parses) it in the
# terminal summary, where CPython 3.11.7's process-global AST recursion counter (gh-106905) can
# be disturbed by a thread compiling at the same moment and fail the run after all tests passed.
import hypothesis  # noqa: F401
import pytest
from actor_services import calc_row, start_scripted
from fixtures_envd import TEST_IMAGE

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Like Qwen3's: <think>...</think> is dropped from assistant turns before the last user message.
THINK_STRIPPING = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)

_CORPUS = [
    "THOUGHT: I will look at the file first.\n\n```bash\ncat src/calc.py\n```\n",
    "<returncode>0</returncode>\n<output>\ndef add(a, b):\n    return a - b\n</output>",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached",
    "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1,2 +1,2 @@",
    "Please always provide EXACTLY ONE action in triple backticks, found 0 actions.",
    "<think>Let me reason about the bug.</think>\nThe sum is wrong.",
    "pytest -q tests/test_calc.py  1 failed, 3 passed in 0.02s",
] * 20


def build_tokenizer(out: Path, template: str = CHATML):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    fast.chat_template = template
    fast.save_pretrained(out)
    return PreTrainedTokenizerFast.from_pretrained(out)


@pytest.fixture(scope="session")
def chatml_tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok-chatml"))


@pytest.fixture(scope="session")
def think_tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok-think"), THINK_STRIPPING)


@pytest.fixture
def scripted(tiny_model_dir, redis_url, tmp_path):
    """The scripted policy server (registered as a ready server at version 0) and its rows:
    the gold fix, then a wrong fix."""
    rows = [calc_row(TEST_IMAGE, 1, "fix"), calc_row(TEST_IMAGE, 2, "wrong")]
    p = start_scripted(tiny_model_dir, rows, redis_url, tmp_path / "logs")
    yield p, rows
    p.stop()
