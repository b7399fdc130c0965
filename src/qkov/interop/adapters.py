"""One adapter per Hugging Face ``model_type`` (:mod:`qkov.interop.families` holds the readers they
share). Adding a family is one entry of :data:`FAMILIES` and one test against ``transformers``.

The Llama-like families (Llama, Mistral, Qwen 2 and 3, Gemma 1-3, OLMo 2, Phi-3, StarCoder 2)
differ only by a :class:`LlamaLike` of flags: how the norms sit (Gemma 2 and 3 before and after each
sublayer, OLMo 2 after only), query/key norms, fused projections (Phi-3), a plain MLP (StarCoder 2),
LayerNorm instead of RMSNorm, Gemma's ``1 + w`` and embedding multiplier, and which layers slide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from torch import Tensor

from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop.families import (
    Family,
    Reader,
    activation,
    attention,
    bos,
    head_dim,
    mlp,
    need,
    norm,
    rotary_fields,
    scaled_sqrt,
    soft_caps,
    unembed,
    windows,
)


@dataclass(frozen=True)
class LlamaLike:
    """What sets one Llama-like family apart (see the module docstring)."""

    gemma: bool = False  # RMSNorm's 1 + w, sqrt(d_model) embedding multiplier
    qk_norm: str = "none"
    pre_norms: bool = True
    post_norms: bool = False
    fused: bool = False  # Phi-3's qkv_proj and gate_up_proj
    plain_mlp: bool = False  # StarCoder 2: c_fc, c_proj
    layer_norm: bool = False  # StarCoder 2
    windows_everywhere: bool = False  # one sliding_window for every layer
    pre_attn_scalar: bool = False  # Gemma 2 and 3: scores / sqrt(query_pre_attn_scalar)


def llama_config(kind: LlamaLike, data: dict, where: str) -> Config:
    """The qkov config of a Llama-like ``config.json``."""
    e, n = head_dim(data, where), need(data, where, "num_hidden_layers")
    h, kv = need(data, where, "num_attention_heads"), data.get("num_key_value_heads")
    scale = math.sqrt(need(data, where, "query_pre_attn_scalar")) if kind.pre_attn_scalar else None
    vocab = need(data, where, "vocab_size")
    return Config(
        n_layers=n,
        n_heads=h,
        d_model=need(data, where, "hidden_size"),
        d_head=e,
        d_vocab=vocab,
        n_ctx=need(data, where, "max_position_embeddings"),
        normalization="LN" if kind.layer_norm else "RMS",
        d_mlp=need(data, where, "intermediate_size"),
        act_fn=activation(data, where, "hidden_activation", "hidden_act"),
        ln_eps=float(need(data, where, "rms_norm_eps", "norm_epsilon", "layer_norm_eps")),
        source="huggingface",
        bos_token_id=bos(data, vocab),
        n_key_value_heads=None if kv in (None, h) else kv,
        gated_mlp=not kind.plain_mlp,
        qk_norm=kind.qk_norm,
        pre_norms=kind.pre_norms,
        post_norms=kind.post_norms,
        attn_scale=scale,
        layer_windows=windows(data, n, kind.windows_everywhere),
        **rotary_fields(data, where, e),
        **soft_caps(data),
    )


def llama_layer(kind: LlamaLike, read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    """One decoder layer's tensors."""
    out: dict[str, Tensor] = {}
    p, q = f"model.layers.{layer}.", f"blocks.{layer}."
    a = p + "self_attn."
    if kind.fused:
        qkv = read(a + "qkv_proj.weight")
        sizes = [cfg.n_heads * cfg.d_head] + [cfg.n_kv_heads * cfg.d_head] * 2
        wq, wk, wv = qkv.split(sizes)
    else:
        wq, wk, wv = (read(a + f"{x}_proj.weight") for x in "qkv")
    biases = tuple(read.optional(a + f"{x}_proj.bias") for x in "qkvo")
    attention(out, layer, cfg, wq, wk, wv, read(a + "o_proj.weight"), biases)
    if kind.qk_norm != "none":
        norm(out, q + "attn.q_norm", read, a + "q_norm", kind.gemma)
        norm(out, q + "attn.k_norm", read, a + "k_norm", kind.gemma)
    llama_mlp(kind, read, layer, out)
    for ours, theirs in llama_norm_names(kind):
        norm(out, q + ours, read, p + theirs, kind.gemma)
    return out


def llama_norm_names(kind: LlamaLike) -> list[tuple[str, str]]:
    """qkov's norm names and the family's: Llama's ``post_attention_layernorm`` is the norm before
    the MLP; Gemma 2's and OLMo 2's is the norm after attention."""
    if kind.post_norms and kind.pre_norms:
        return [
            ("ln1", "input_layernorm"),
            ("ln1_post", "post_attention_layernorm"),
            ("ln2", "pre_feedforward_layernorm"),
            ("ln2_post", "post_feedforward_layernorm"),
        ]
    if kind.post_norms:
        return [("ln1_post", "post_attention_layernorm"), ("ln2_post", "post_feedforward_layernorm")]
    return [("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")]


def llama_mlp(kind: LlamaLike, read: Reader, layer: int, out: dict) -> None:
    m = f"model.layers.{layer}.mlp."
    if kind.plain_mlp:
        mlp(
            out,
            layer,
            read(m + "c_fc.weight"),
            read(m + "c_proj.weight"),
            read.optional(m + "c_fc.bias"),
            read.optional(m + "c_proj.bias"),
        )
        return
    if kind.fused:
        gate, up = read(m + "gate_up_proj.weight").chunk(2)
    else:
        gate, up = read(m + "gate_proj.weight"), read(m + "up_proj.weight")
    mlp(
        out,
        layer,
        up,
        read(m + "down_proj.weight"),
        read.optional(m + "up_proj.bias"),
        read.optional(m + "down_proj.bias"),
        w_gate=gate,
        b_gate=read.optional(m + "gate_proj.bias"),
    )


def llama_ends(kind: LlamaLike, read: Reader, cfg: Config, data: dict) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    embed = read("model.embed_tokens.weight")
    out["W_E"] = embed.double() * scaled_sqrt(cfg.d_model) if kind.gemma else embed
    norm(out, "ln_final", read, "model.norm", kind.gemma)
    unembed(out, read, data, "model.embed_tokens.weight")
    return out


def llama_like(kind: LlamaLike) -> Family:
    return Family(partial(llama_config, kind), partial(llama_ends, kind), partial(llama_layer, kind))


# -- GPT-NeoX (Pythia), GPT-J, GPT-Neo, OPT, GPTBigCode --------------------------------------------
def neox_config(data: dict, where: str) -> Config:
    e, vocab = head_dim(data, where), need(data, where, "vocab_size")
    return Config(
        n_layers=need(data, where, "num_hidden_layers"),
        n_heads=need(data, where, "num_attention_heads"),
        d_model=need(data, where, "hidden_size"),
        d_head=e,
        d_vocab=vocab,
        n_ctx=need(data, where, "max_position_embeddings"),
        normalization="LN",
        d_mlp=need(data, where, "intermediate_size"),
        act_fn=activation(data, where, "hidden_act"),
        ln_eps=float(data.get("layer_norm_eps", 1e-5)),
        source="huggingface",
        bos_token_id=bos(data, vocab),
        parallel_attn_mlp=bool(data.get("use_parallel_residual", True)),
        **rotary_fields(data, where, e),
    )


def split_per_head(
    weight: Tensor, bias: Tensor | None, n_heads: int
) -> tuple[tuple[Tensor, ...], tuple[Tensor | None, ...]]:
    """A fused query-key-value projection whose rows run head by head, each head's query, key and
    value together (GPT-NeoX; GPT-BigCode without multi-query): the three weights ``[n_heads *
    d_head, d_model]`` and the three biases (None without one)."""
    w = weight.reshape(n_heads, 3, -1, weight.shape[-1])
    weights = tuple(w[:, i].flatten(0, 1) for i in range(3))
    if bias is None:
        return weights, (None,) * 3
    return weights, tuple(bias.reshape(n_heads, 3, -1)[:, i].flatten() for i in range(3))


def neox_ends(read: Reader, cfg: Config, data: dict) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {"W_E": read("gpt_neox.embed_in.weight")}
    norm(out, "ln_final", read, "gpt_neox.final_layer_norm")
    unembed(out, read, data, "gpt_neox.embed_in.weight", head="embed_out")
    return out


def neox_layer(read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    p, q = f"gpt_neox.layers.{layer}.", f"blocks.{layer}."
    w, b = split_per_head(
        read(p + "attention.query_key_value.weight"),
        read.optional(p + "attention.query_key_value.bias"),
        cfg.n_heads,
    )
    attention(
        out,
        layer,
        cfg,
        *w,
        read(p + "attention.dense.weight"),
        (*b, read.optional(p + "attention.dense.bias")),
    )
    mlp(
        out,
        layer,
        read(p + "mlp.dense_h_to_4h.weight"),
        read(p + "mlp.dense_4h_to_h.weight"),
        read(p + "mlp.dense_h_to_4h.bias"),
        read(p + "mlp.dense_4h_to_h.bias"),
    )
    norm(out, q + "ln1", read, p + "input_layernorm")
    norm(out, q + "ln2", read, p + "post_attention_layernorm")
    return out


def gpt2_style_fields(data: dict, where: str) -> dict:
    """The Config fields of a family that names its sizes as GPT-2 does (``n_embd``, ``n_head``,
    ``n_layer``, ``n_positions``, ``n_inner``, ``activation_function``), with LayerNorm."""
    d, h, vocab = need(data, where, "n_embd"), need(data, where, "n_head"), need(data, where, "vocab_size")
    return dict(
        n_layers=need(data, where, "n_layer"),
        n_heads=h,
        d_model=d,
        d_head=d // h,
        d_vocab=vocab,
        n_ctx=need(data, where, "n_positions"),
        normalization="LN",
        d_mlp=data.get("n_inner") or 4 * d,
        act_fn=activation(data, where, "activation_function"),
        ln_eps=float(data.get("layer_norm_epsilon", 1e-5)),
        source="huggingface",
        bos_token_id=bos(data, vocab),
    )


def gptj_config(data: dict, where: str) -> Config:
    fields = gpt2_style_fields(data, where)
    rotary = data.get("rotary_dim")
    return Config(
        **fields,
        positional_embedding="rotary",
        rotary_dim=None if rotary in (None, fields["d_head"]) else rotary,
        rotary_interleaved=True,
        parallel_attn_mlp=True,
    )


def gpt2_style_ends(read: Reader, cfg: Config, data: dict, positions: bool = True) -> dict[str, Tensor]:
    """The embedding (with ``positions``, the learned positions), final norm and unembedding of a
    family that names them as GPT-2 does (``transformer.wte``, ``wpe``, ``ln_f``)."""
    out = {"W_E": read("transformer.wte.weight")}
    if positions:
        out["W_pos"] = read("transformer.wpe.weight")
    norm(out, "ln_final", read, "transformer.ln_f")
    unembed(out, read, data, "transformer.wte.weight")
    return out


def gptj_layer(read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    p, q = f"transformer.h.{layer}.", f"blocks.{layer}."
    a = p + "attn."
    attention(out, layer, cfg, *(read(a + f"{x}_proj.weight") for x in ("q", "k", "v", "out")))
    mlp(
        out,
        layer,
        read(p + "mlp.fc_in.weight"),
        read(p + "mlp.fc_out.weight"),
        read(p + "mlp.fc_in.bias"),
        read(p + "mlp.fc_out.bias"),
    )
    norm(out, q + "ln1", read, p + "ln_1")
    out[q + "ln2.w"], out[q + "ln2.b"] = out[q + "ln1.w"], out[q + "ln1.b"]  # one norm feeds both
    return out


def gpt_neo_config(data: dict, where: str) -> Config:
    d, h, vocab = (
        need(data, where, "hidden_size"),
        need(data, where, "num_heads"),
        need(data, where, "vocab_size"),
    )
    n, types = need(data, where, "num_layers"), data.get("attention_layers") or []
    window = data.get("window_size", 256)
    return Config(
        n_layers=n,
        n_heads=h,
        d_model=d,
        d_head=d // h,
        d_vocab=vocab,
        n_ctx=need(data, where, "max_position_embeddings"),
        positional_embedding="standard",
        normalization="LN",
        d_mlp=data.get("intermediate_size") or 4 * d,
        act_fn=activation(data, where, "activation_function"),
        ln_eps=float(data.get("layer_norm_epsilon", 1e-5)),
        source="huggingface",
        bos_token_id=bos(data, vocab),
        attn_scale=1.0,  # GPT-Neo does not scale its scores
        layer_windows=tuple(window if t == "local" else None for t in types[:n]) if types else None,
    )


def gpt_neo_layer(read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    p, q = f"transformer.h.{layer}.", f"blocks.{layer}."
    a = p + "attn.attention."
    attention(
        out,
        layer,
        cfg,
        *(read(a + f"{x}_proj.weight") for x in ("q", "k", "v", "out")),
        (None, None, None, read(a + "out_proj.bias")),
    )
    mlp(
        out,
        layer,
        read(p + "mlp.c_fc.weight"),
        read(p + "mlp.c_proj.weight"),
        read(p + "mlp.c_fc.bias"),
        read(p + "mlp.c_proj.bias"),
    )
    norm(out, q + "ln1", read, p + "ln_1")
    norm(out, q + "ln2", read, p + "ln_2")
    return out


def opt_config(data: dict, where: str) -> Config:
    d, h, vocab = (
        need(data, where, "hidden_size"),
        need(data, where, "num_attention_heads"),
        need(data, where, "vocab_size"),
    )
    if not data.get("do_layer_norm_before", True) or data.get("_remove_final_layer_norm"):
        raise QkovError(
            f"{where}: OPT with its norms after each layer is not supported (do_layer_norm_before)"
        )
    if data.get("word_embed_proj_dim", d) != d:
        raise QkovError(f"{where}: OPT's projected embeddings are not supported (word_embed_proj_dim)")
    return Config(
        n_layers=need(data, where, "num_hidden_layers"),
        n_heads=h,
        d_model=d,
        d_head=d // h,
        d_vocab=vocab,
        n_ctx=need(data, where, "max_position_embeddings"),
        positional_embedding="standard",
        normalization="LN",
        d_mlp=need(data, where, "ffn_dim"),
        act_fn=activation(data, where, "activation_function"),
        source="huggingface",
        bos_token_id=bos(data, vocab),
    )


OPT_POSITION_OFFSET = 2  # OPT's learned positions start at row 2 (rows 0 and 1 are padding's)


def opt_ends(read: Reader, cfg: Config, data: dict) -> dict[str, Tensor]:
    pre = "model.decoder."
    out = {
        "W_E": read(pre + "embed_tokens.weight"),
        "W_pos": read(pre + "embed_positions.weight")[OPT_POSITION_OFFSET:],
    }
    norm(out, "ln_final", read, pre + "final_layer_norm")
    unembed(out, read, data, pre + "embed_tokens.weight")
    return out


def opt_layer(read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    p, q = f"model.decoder.layers.{layer}.", f"blocks.{layer}."
    a, names = p + "self_attn.", ("q", "k", "v", "out")
    attention(
        out,
        layer,
        cfg,
        *(read(a + f"{x}_proj.weight") for x in names),
        tuple(read.optional(a + f"{x}_proj.bias") for x in names),
    )
    mlp(
        out,
        layer,
        read(p + "fc1.weight"),
        read(p + "fc2.weight"),
        read.optional(p + "fc1.bias"),
        read.optional(p + "fc2.bias"),
    )
    norm(out, q + "ln1", read, p + "self_attn_layer_norm")
    norm(out, q + "ln2", read, p + "final_layer_norm")
    return out


def bigcode_config(data: dict, where: str) -> Config:
    fields = gpt2_style_fields(data, where)
    if data.get("scale_attn_weights") is False:
        raise QkovError(f"{where}: attention without the 1/sqrt(d_head) scale is not supported")
    return Config(
        **fields,
        positional_embedding="standard",
        n_key_value_heads=1 if data.get("multi_query", True) else None,
    )


def bigcode_layer(read: Reader, cfg: Config, layer: int) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    d, e, h = cfg.d_model, cfg.d_head, cfg.n_heads
    p, q = f"transformer.h.{layer}.", f"blocks.{layer}."
    w, b = read(p + "attn.c_attn.weight"), read.optional(p + "attn.c_attn.bias")
    if cfg.n_kv_heads == 1:  # multi-query: all queries, then the one key and value head
        parts = w.split([d, e, e]), (b.split([d, e, e]) if b is not None else (None,) * 3)
    else:
        parts = split_per_head(w, b, h)
    attention(
        out,
        layer,
        cfg,
        *parts[0],
        read(p + "attn.c_proj.weight"),
        (*parts[1], read.optional(p + "attn.c_proj.bias")),
    )
    mlp(
        out,
        layer,
        read(p + "mlp.c_fc.weight"),
        read(p + "mlp.c_proj.weight"),
        read.optional(p + "mlp.c_fc.bias"),
        read.optional(p + "mlp.c_proj.bias"),
    )
    norm(out, q + "ln1", read, p + "ln_1")
    norm(out, q + "ln2", read, p + "ln_2")
    return out


GEMMA2 = LlamaLike(gemma=True, post_norms=True, pre_attn_scalar=True)
FAMILIES: dict[str, Family] = {
    "llama": llama_like(LlamaLike()),
    "mistral": llama_like(LlamaLike(windows_everywhere=True)),
    "qwen2": llama_like(LlamaLike()),
    "qwen3": llama_like(LlamaLike(qk_norm="head")),
    "gemma": llama_like(LlamaLike(gemma=True)),
    "gemma2": llama_like(GEMMA2),
    "gemma3_text": llama_like(LlamaLike(gemma=True, post_norms=True, pre_attn_scalar=True, qk_norm="head")),
    "olmo2": llama_like(LlamaLike(qk_norm="all", pre_norms=False, post_norms=True)),
    "phi3": llama_like(LlamaLike(fused=True, windows_everywhere=True)),
    "starcoder2": llama_like(LlamaLike(plain_mlp=True, layer_norm=True, windows_everywhere=True)),
    "gpt_neox": Family(neox_config, neox_ends, neox_layer),
    "gptj": Family(gptj_config, partial(gpt2_style_ends, positions=False), gptj_layer),
    "gpt_neo": Family(gpt_neo_config, gpt2_style_ends, gpt_neo_layer),
    "opt": Family(opt_config, opt_ends, opt_layer),
    "gpt_bigcode": Family(bigcode_config, gpt2_style_ends, bigcode_layer),
}
