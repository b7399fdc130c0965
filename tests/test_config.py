"""A model's shape (``qkov.Config``): every field checked with its own one-line error, the JSON of
``config.json`` round-tripping, old files without the newer fields loading with the defaults of
the attention-only model they describe, and what the output width and the start token mean."""

from __future__ import annotations

import dataclasses
import json

import pytest

import qkov

OLD = {"n_layers": 1, "n_heads": 1, "d_model": 4, "d_head": 2, "d_vocab": 5, "n_ctx": 3}
SIZES = dict(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=20, n_ctx=8)


@pytest.mark.parametrize("field", ["n_heads", "d_model", "d_head", "d_vocab", "n_ctx"])
def test_config_rejects_nonpositive_sizes(field):
    kwargs = dict(n_layers=1, n_heads=2, d_model=8, d_head=4, d_vocab=20, n_ctx=8) | {field: 0}
    with pytest.raises(qkov.QkovError, match=field):
        qkov.Config(**kwargs)


def test_config_rejects_unknown_positional_embedding():
    with pytest.raises(qkov.QkovError, match="positional_embedding"):
        qkov.Config(1, 2, 8, 4, 20, 8, positional_embedding="alibi")


@pytest.mark.parametrize(
    ("field", "value"),
    [("normalization", "RMSNorm"), ("act_fn", "solu_ln"), ("d_mlp", -1), ("ln_eps", 0.0), ("source", "hub")],
)
def test_config_rejects_unsupported_options(field, value):
    with pytest.raises(qkov.QkovError, match=f"config: {field} must be"):
        qkov.Config(1, 2, 8, 4, 20, 8, **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        *[(f, v, f"config: {f} must be a positive integer, got {v!r}")
          for f in ("n_heads", "d_model", "d_head", "d_vocab", "n_ctx") for v in (0, -3, 2.0, True, "4")],
        *[("n_layers", v, f"config: n_layers must be a non-negative integer, got {v!r}")
          for v in (-1, 1.0, True)],
        ("positional_embedding", "alibi",
         "config: positional_embedding must be one of shortformer, standard, rotary, none, got 'alibi'"),
        ("normalization", "RMSNorm",
         "config: normalization must be one of none, LN, LNPre, RMS, RMSPre, got 'RMSNorm'"),
        ("act_fn", "solu_ln", "config: act_fn must be one of gelu_new, gelu, relu, silu, got 'solu_ln'"),
        ("source", "hub", "config: source must be one of qkov, huggingface, transformer_lens, got 'hub'"),
        *[("d_mlp", v, f"config: d_mlp must be a non-negative integer, got {v!r}") for v in (-1, 2.5, False)],
        *[("ln_eps", v, f"config: ln_eps must be a positive number, got {v!r}")
          for v in (0.0, -1e-5, True, "1")],
        *[("d_vocab_out", v, f"config: d_vocab_out must be a positive integer or null, got {v!r}")
          for v in (0, 2.0, True)],
        *[("bos_token_id", v, f"config: bos_token_id must be a token id in [0, 20) or null, got {v!r}")
          for v in (-1, 20, 1.0, True)],
    ],
)  # fmt: skip
def test_each_bad_field_is_its_own_one_line_error(field, value, message):
    with pytest.raises(qkov.QkovError) as info:
        qkov.Config(**(SIZES | {field: value}))
    assert str(info.value) == message


def test_the_edges_of_each_range_are_accepted():
    cfg = qkov.Config(0, 1, 1, 1, 1, 1, d_mlp=0, ln_eps=1e-12, d_vocab_out=1, bos_token_id=0)
    assert (cfg.n_layers, cfg.d_out, cfg.bos_token_id) == (0, 1, 0)
    assert qkov.Config(1, 2, 8, 4, 20, 8, bos_token_id=19, ln_eps=1).bos_token_id == 19  # the last token id


def test_the_json_round_trips_every_field():
    cfg = qkov.Config(
        2, 3, 12, 4, 40, 24, positional_embedding="standard", normalization="LNPre", d_mlp=16,
        act_fn="relu", ln_eps=1e-6, source="huggingface", d_vocab_out=2, bos_token_id=39,
    )  # fmt: skip
    text = cfg.to_json()
    # a model without the newer architectures' options writes the fields it always did
    assert text.endswith("}\n") and json.loads(text) == cfg.to_dict()
    assert qkov.Config.from_dict(json.loads(text)) == cfg
    names = [f.name for f in dataclasses.fields(qkov.Config)]
    assert list(json.loads(text)) == names[: names.index("rotary_dim")]
    modern = dataclasses.replace(
        cfg, positional_embedding="rotary", normalization="RMS", rotary_dim=2, rotary_base=500000.0,
        rotary_interleaved=True, rotary_scaling={"rope_type": "linear", "factor": 2.0}, rotary_local_base=1e4,
        n_key_value_heads=1, gated_mlp=True, parallel_attn_mlp=True, qk_norm="all", pre_norms=False,
        post_norms=True, attn_scale=3.0, scale_attn_by_inverse_layer_idx=True, attn_scores_soft_cap=50.0,
        output_logits_soft_cap=30.0, layer_windows=(4, None), attention_dir="bidirectional",
    )  # fmt: skip
    data = json.loads(modern.to_json())
    assert list(data) == names and qkov.Config.from_dict(data) == modern


def test_a_config_from_before_the_newer_fields_loads_with_their_defaults():
    cfg = qkov.Config.from_dict(OLD)
    assert cfg == qkov.Config(1, 1, 4, 2, 5, 3)
    shape = (cfg.positional_embedding, cfg.normalization, cfg.d_mlp, cfg.act_fn)
    assert shape == ("shortformer", "none", 0, "gelu_new")
    assert (cfg.ln_eps, cfg.source, cfg.d_vocab_out, cfg.bos_token_id) == (1e-5, "qkov", None, None)
    assert not cfg.has_mlp and not cfg.has_layer_norm and cfg.has_positions


def test_old_config_files_load_and_the_new_fields_are_checked(tmp_path):
    old = {"n_layers": 1, "n_heads": 1, "d_model": 4, "d_head": 2, "d_vocab": 5, "n_ctx": 3}
    cfg = qkov.Config.from_dict(old)
    assert cfg.d_vocab_out is None and cfg.bos_token_id is None and cfg.d_out == 5 and cfg.outputs_tokens
    assert json.loads(cfg.to_json())["d_vocab_out"] is None
    for bad, words in ((dict(d_vocab_out=0), "d_vocab_out"), (dict(bos_token_id=5), "bos_token_id"),
                       (dict(bos_token_id=True), "bos_token_id")):  # fmt: skip
        with pytest.raises(qkov.QkovError, match=words):
            qkov.Config.from_dict(old | bad)
    assert not qkov.Config.from_dict(old | {"d_vocab_out": 2}).outputs_tokens


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "config.json: expected a JSON object"),
        (OLD | {"d_ff": 4, "alpha": 1}, "config.json: unknown field(s) alpha, d_ff"),
        (
            {"n_layers": 1, "n_heads": 1, "d_model": 4, "d_head": 2},
            "config.json: missing field(s) d_vocab, n_ctx",
        ),
        (OLD | {"n_ctx": 0}, "config: n_ctx must be a positive integer, got 0"),
    ],
)
def test_a_bad_config_json_is_one_line(data, message):
    with pytest.raises(qkov.QkovError) as info:
        qkov.Config.from_dict(data)
    assert str(info.value) == message


def test_the_output_width_and_what_it_allows():
    lm = qkov.Config.from_dict(OLD | {"d_vocab_out": 5})  # as wide as the vocabulary: still tokens out
    classifier = qkov.Config.from_dict(OLD | {"d_vocab_out": 2})
    assert (lm.d_out, lm.outputs_tokens) == (5, True)
    assert (classifier.d_out, classifier.outputs_tokens) == (2, False)
    for scheme, positions in (("shortformer", True), ("standard", True), ("none", False)):
        assert qkov.Config.from_dict(OLD | {"positional_embedding": scheme}).has_positions == positions
    for norm, has in (("none", False), ("LN", True), ("LNPre", True)):
        assert qkov.Config.from_dict(OLD | {"normalization": norm}).has_layer_norm == has
    assert qkov.Config.from_dict(OLD | {"d_mlp": 3}).has_mlp
