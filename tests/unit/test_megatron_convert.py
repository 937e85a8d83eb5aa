"""HF <-> megatron-core weight conversion (pure tensors): every TP/PP shard of an HF model,
converted and gathered back, is the HF model bit for bit; the fused layouts are megatron's."""

from __future__ import annotations

import pytest
import torch

from rstar2.learner.megatron.convert import (
    Dims,
    Shard,
    fuse_qkv,
    hf_tensors,
    mcore_shard,
    split_qkv,
)


def _dims(*, qwen2: bool, tied: bool) -> Dims:
    return Dims(
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        hidden_size=16,
        vocab_size=50,
        padded_vocab_size=64,
        tied_embeddings=tied,
        qkv_bias=qwen2,
        qk_layernorm=not qwen2,
    )


def _hf_state(d: Dims, ffn: int = 24) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    state = {
        "model.embed_tokens.weight": r(d.vocab_size, d.hidden_size),
        "model.norm.weight": r(16),
    }
    if not d.tied_embeddings:
        state["lm_head.weight"] = r(d.vocab_size, d.hidden_size)
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    for i in range(d.num_layers):
        p = f"model.layers.{i}."
        state |= {
            p + "input_layernorm.weight": r(16),
            p + "post_attention_layernorm.weight": r(16),
            p + "self_attn.q_proj.weight": r(q, 16),
            p + "self_attn.k_proj.weight": r(kv, 16),
            p + "self_attn.v_proj.weight": r(kv, 16),
            p + "self_attn.o_proj.weight": r(16, q),
            p + "mlp.gate_proj.weight": r(ffn, 16),
            p + "mlp.up_proj.weight": r(ffn, 16),
            p + "mlp.down_proj.weight": r(16, ffn),
        }
        if d.qkv_bias:
            state |= {
                p + f"self_attn.{x}_proj.bias": r(n) for x, n in (("q", q), ("k", kv), ("v", kv))
            }
        if d.qk_layernorm:
            state |= {p + "self_attn.q_norm.weight": r(8), p + "self_attn.k_norm.weight": r(8)}
    return state


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize(("qwen2", "tied"), [(False, False), (False, True), (True, False)])
def test_hf_to_megatron_and_back_is_bit_exact(tp: int, pp: int, qwen2: bool, tied: bool) -> None:
    d = _dims(qwen2=qwen2, tied=tied)
    hf = _hf_state(d)
    shards = {
        (t, p): dict(mcore_shard(hf.__getitem__, d, Shard(tp_rank=t, tp=tp, pp_rank=p, pp=pp)))
        for t in range(tp)
        for p in range(pp)
    }
    back: dict[str, torch.Tensor] = {}
    for p in range(pp):
        offset = Shard(pp_rank=p, pp=pp).layers(d.num_layers).start
        for name in shards[(0, p)]:
            pieces = [shards[(t, p)][name] for t in range(tp)]
            assert all(x.shape == pieces[0].shape for x in pieces)  # equal TP slices
            for hf_name, tensor in hf_tensors(name, pieces, d, offset):
                assert hf_name not in back, f"{hf_name} exported twice"
                back[hf_name] = tensor
    expected = {k: v for k, v in hf.items() if not (tied and k == "lm_head.weight")}
    assert sorted(back) == sorted(expected)
    assert all(torch.equal(back[k], expected[k]) for k in expected)


def test_fused_layouts_are_megatrons() -> None:
    d = _dims(qwen2=False, tied=False)
    q = torch.arange(32.0).reshape(32, 1)  # 4 heads x 8
    k = 100 + torch.arange(16.0).reshape(16, 1)  # 2 groups x 8
    v = 200 + torch.arange(16.0).reshape(16, 1)
    fused = fuse_qkv(q, k, v, d)
    # group 0: q heads 0-1, k head 0, v head 0; then group 1
    assert fused[:16, 0].tolist() == list(range(16))
    assert fused[16:24, 0].tolist() == [100.0 + i for i in range(8)]
    assert fused[24:32, 0].tolist() == [200.0 + i for i in range(8)]
    assert fused[32:48, 0].tolist() == list(range(16, 32))
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, d), (q, k, v), strict=True))
    hf = _hf_state(d)
    two = [dict(mcore_shard(hf.__getitem__, d, Shard(tp_rank=t, tp=2))) for t in range(2)]
    fc1 = two[1]["decoder.layers.0.mlp.linear_fc1.weight"]  # TP shard 1 is [gate_1; up_1]
    assert torch.equal(fc1[:12], hf["model.layers.0.mlp.gate_proj.weight"][12:])
    assert torch.equal(fc1[12:], hf["model.layers.0.mlp.up_proj.weight"][12:])
    emb = two[1]["embedding.word_embeddings.weight"]  # padded rows 50..63 on the last shard
    assert emb.shape == (32, 16) and torch.count_nonzero(emb[18:]) == 0
