"""TransformerLens' options of the newer architectures, both ways: a qkov model with each option
exported to a TransformerLens 3 ``HookedTransformer`` computes the same log-probabilities in float64
(TransformerLens is the oracle), and saved by TransformerLens and read back it is the same model."""

from __future__ import annotations

import warnings

import pytest
import torch

from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop import from_transformer_lens, save_transformer_lens, to_hooked_transformer
from qkov.model import Transformer

pytest.importorskip("transformer_lens")
BASE = dict(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=50, n_ctx=32, d_mlp=40)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}  # fmt: skip
CASES = {
    "RMS": dict(normalization="RMS"),
    "RMSPre": dict(normalization="RMSPre"),
    "GQA, gated MLP": dict(normalization="RMS", n_key_value_heads=2, gated_mlp=True, act_fn="silu"),
    "MQA": dict(normalization="LN", n_key_value_heads=1),
    "parallel": dict(normalization="LN", parallel_attn_mlp=True),
    "soft-caps that bind": dict(normalization="RMS", attn_scores_soft_cap=1.0, output_logits_soft_cap=2.0),
    "bidirectional": dict(normalization="LN", attention_dir="bidirectional"),
    "local attention": dict(normalization="LN", layer_windows=(3, None)),
    "qk norm, post norms": dict(normalization="RMS", qk_norm="head", post_norms=True),
    "attention scales": dict(normalization="LN", attn_scale=2.0, scale_attn_by_inverse_layer_idx=True),
    "rotary": dict(normalization="RMS", positional_embedding="rotary"),
    "rotary, partial, adjacent pairs": dict(
        normalization="LN", positional_embedding="rotary", rotary_dim=4, rotary_interleaved=True
    ),
    "rotary, Llama 3 scaling": dict(
        normalization="RMS", positional_embedding="rotary", rotary_scaling=LLAMA3
    ),
}
# TransformerLens computes rotary frequencies as base^(2i/d) in the model's precision, transformers
# (and qkov, its oracle) as 1/base^(2i/d) in float32, the numbers every such checkpoint was run with:
# the angles differ by float32 rounding.
ROTARY_TOLERANCE = 1e-6


def random_model(options: dict) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(
        Config(**(BASE | {"positional_embedding": "standard"} | options)), biases=True
    ).double()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.add_(torch.randn_like(param) * 0.3)
            if model.cfg.gated_mlp and name.endswith(("b_in", "b_gate")):
                param.zero_()  # TransformerLens' gated MLP adds b_in after the gate
    return model.requires_grad_(False)


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_each_option_computes_what_transformer_lens_computes(options, tmp_path):
    model = random_model(options)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked = to_hooked_transformer(model)
    ours = model(tokens).log_softmax(-1)
    tolerance = ROTARY_TOLERANCE if model.cfg.positional_embedding == "rotary" else 1e-12
    assert (ours - hooked(tokens).log_softmax(-1)).abs().max() < tolerance
    save_transformer_lens(hooked, tmp_path)
    back = from_transformer_lens(tmp_path, fold=False).double()
    assert back.cfg == model.cfg.__class__(**(model.cfg.to_dict() | {"source": "transformer_lens"}))
    assert torch.equal(back(tokens).log_softmax(-1), ours)
    folded = from_transformer_lens(tmp_path).double()
    assert (folded(tokens).log_softmax(-1) - ours).abs().max() < 1e-12


def test_what_transformer_lens_cannot_hold_is_refused_in_one_line():
    with pytest.raises(QkovError, match="query norm over all heads"):
        to_hooked_transformer(random_model(dict(normalization="RMS", qk_norm="all")))
    gated = random_model(dict(normalization="RMS", gated_mlp=True))
    with torch.no_grad():
        gated.blocks[0].mlp.b_in.fill_(0.5)
    with pytest.raises(QkovError, match="adds b_in after the gate"):
        to_hooked_transformer(gated)
