"""Pure parts of the distributed transport: SGLang's rank layout and bucketing."""

from __future__ import annotations

import torch

from weight_sync.update_group import buckets, dtype_name, rank_layout


def test_rank_layout_follows_sglang() -> None:
    # trainer is rank 0; server i starts at 1 + the tp sizes before it; world = 1 + all
    assert rank_layout([1]) == ([1], 2)
    assert rank_layout([2, 1, 4]) == ([1, 3, 4], 8)


def test_buckets_keep_order_and_bound_size() -> None:
    ts = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    out = list(buckets(ts, bucket_bytes=80))
    assert [[n for n, _ in b] for b in out] == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]
    assert [n for b in out for n, _ in b] == [n for n, _ in ts]
    assert all(sum(t.numel() * 4 for _, t in b) <= 80 or len(b) == 1 for b in out)
    assert dtype_name(torch.bfloat16) == "bfloat16"
