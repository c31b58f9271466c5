"""A tiny random Qwen3 causal LM with a byte-level BPE tokenizer trained offline on bundled
text: the model every test and the local CPU run use (nothing comes from a hub).

Deterministic for a seed: the same seed writes the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# directly in the package so pyproject's package-data "*.txt" ships it
CORPUS = Path(__file__).resolve().parent / "tokenizer_corpus.txt"

# ChatML, as Qwen uses: `<|im_start|>role\n...<|im_end|>\n`, generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Qwen2/Qwen3's pre-tokenizer pattern: numbers are split into single digits (so a number is
# spelled with tokens every text trains, whatever its value) and runs of letters keep one leading
# non-letter. With GPT-2's `\p{N}+` a number the corpus held was one token and any other was
# cut into unrelated pieces, and the warm-started tiny model could not copy an unseen number.
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

DEFAULT_SIZE: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}


def train_tokenizer(vocab_size: int):
    """Byte-level BPE trained on the bundled corpus (single-threaded, so merges are stable)."""
    import os

    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text().split("\n\n"), trainer=trainer)
    return tok


def init_tiny(out_dir: str | Path, seed: int = 0, **size_overrides: Any) -> Path:
    """Write a random-init Qwen3ForCausalLM + tokenizer to `out_dir` in HF format; return it."""
    import torch
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    size = {**DEFAULT_SIZE, **size_overrides}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(size["vocab_size"]),
        eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=None, unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE, model_max_length=size["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tok.save_pretrained(out)
    eos_id, pad_id = tok.eos_token_id, tok.pad_token_id

    config = Qwen3Config(**size, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
                         dtype="float32")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    # Re-draw every weight from our own generator so the bytes depend on the seed only.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id,
                     do_sample=True, temperature=1.0, top_p=1.0).save_pretrained(out)
    (out / "swarl_tiny.json").write_text(json.dumps({"seed": seed, "size": size}, sort_keys=True) + "\n")
    return out
