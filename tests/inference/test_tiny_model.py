from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from inference.tiny_model import init_tiny

REPO = Path(__file__).resolve().parents[2]


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_model_dir):
    t0 = time.monotonic()
    a = init_tiny(tmp_path / "a", seed=0)
    took = time.monotonic() - t0
    b = init_tiny(tmp_path / "b", seed=1)
    assert _files(a) == _files(tiny_model_dir)
    assert _files(a)["model.safetensors"] != _files(b)["model.safetensors"]
    assert _files(a)["tokenizer.json"] == _files(b)["tokenizer.json"]
    assert took < 5.0, f"init-tiny took {took:.1f}s"


def test_model_is_tiny_qwen3_with_chatml_tokenizer(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    n = sum(p.numel() for p in model.parameters())
    assert n < 3_000_000, n
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim) == (4096, 128, 4, 4, 2, 32)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 8192

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix foo.py"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nfix foo.py<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.eos_token_id in ids
    # byte-level: any text round-trips, and code is compressed well by the trained merges
    code = "def f(x):\n    return x + 1  # ünïcode ✓\n$ git diff --cached\n"
    enc = tok(code, add_special_tokens=False)["input_ids"]
    assert tok.decode(enc) == code
    assert len(enc) < len(code.encode()) / 2
    # digits one by one, as Qwen's pre-tokenizer splits them: a number the training data never
    # held is made of tokens it did (a model can copy it digit by digit), and merges never
    # glue a digit to a letter or to another digit
    pieces = [tok.decode([i]) for i in tok("fn_75(3, 30) at line 108", add_special_tokens=False)["input_ids"]]
    assert pieces[:4] == ["fn", "_", "7", "5"], pieces
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p)), pieces


def test_cli_init_tiny(tmp_path, tiny_model_dir):
    out = tmp_path / "m"
    res = subprocess.run([sys.executable, "-m", "swarl.cli", "model", "init-tiny", str(out), "--seed", "0"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    assert _files(out) == _files(tiny_model_dir)
