"""Hugging Face models in: every family of :mod:`qkov.interop.adapters`, and GPT-2 here, from a
``transformers`` model (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ...) or a folder it saved
(``config.json`` + ``model.safetensors`` [+ ``tokenizer.json``]), into qkov's (TransformerLens')
names and shapes.

GPT-2 keeps its weights in ``Conv1D`` layers, stored ``[in, out]`` and applied as ``x @ W + b``:
already qkov's row-vector form. The fused ``c_attn`` ``[d_model, 3 d_model]`` splits into ``W_Q``,
``W_K``, ``W_V`` ``[n_heads, d_model, d_head]``; ``c_proj`` ``[n_heads d_head, d_model]`` is
``W_O``; ``lm_head`` (an ``nn.Linear``, ``[d_vocab, d_model]``) is transposed into ``W_U``, and when
the embeddings are tied (GPT-2's default; the saved file then has no ``lm_head``) ``W_U = W_E^T``.
GPT-2's LM head has no bias: ``b_U = 0``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from einops import rearrange

from qkov.config import Config
from qkov.errors import QkovError
from qkov.interop.adapters import FAMILIES
from qkov.interop.families import Family, Reader
from qkov.interop.source import check_finite, model_from_source, read_source
from qkov.model import Transformer

ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
_IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in older files, not weights

# (config key, unsupported when, the feature's name)
_UNSUPPORTED = (
    ("model_type", lambda v: v != "gpt2", "a model type other than GPT-2"),
    ("add_cross_attention", bool, "cross-attention"),
    ("activation_function", lambda v: v not in ACTIVATIONS, "this activation"),
)
_REQUIRED = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")


def hf_config(data: dict[str, Any], where: str) -> Config:
    """The qkov config of a GPT-2 ``config.json``, refusing what qkov cannot run with one line
    naming the feature and the config key. Its ``bos_token_id`` (GPT-2's ``<|endoftext|>``), when it
    is a token of the vocabulary, is the start token: TransformerLens prepends it to every input by
    default (``default_prepend_bos``), and so qkov's tests of the model do."""
    for key, unsupported, feature in _UNSUPPORTED:
        if unsupported(data.get(key, "gpt2" if key == "model_type" else None)):
            raise QkovError(f"{where}: {feature} is not supported ({key}={data.get(key)!r})")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise QkovError(f"{where}: missing field(s) {', '.join(missing)}")
    d_model, n_heads, bos = data["n_embd"], data["n_head"], data.get("bos_token_id")
    if not isinstance(n_heads, int) or n_heads < 1 or not isinstance(d_model, int) or d_model % n_heads:
        raise QkovError(f"{where}: n_embd={d_model!r} is not a multiple of n_head={n_heads!r}")
    return Config(
        n_layers=data["n_layer"],
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_model // n_heads,
        d_vocab=data["vocab_size"],
        n_ctx=data["n_positions"],
        positional_embedding="standard",
        normalization="LN",
        d_mlp=data.get("n_inner") or 4 * d_model,
        act_fn=ACTIVATIONS[data.get("activation_function", "gelu_new")],
        ln_eps=float(data.get("layer_norm_epsilon", 1e-5)),
        source="huggingface",
        bos_token_id=bos if isinstance(bos, int) and 0 <= bos < data["vocab_size"] else None,
        attn_scale=1.0 if data.get("scale_attn_weights") is False else None,
        scale_attn_by_inverse_layer_idx=bool(data.get("scale_attn_by_inverse_layer_idx")),
    )


def expected_hf_shapes(cfg: Config, tied: bool) -> dict[str, tuple[int, ...]]:
    d, m = cfg.d_model, cfg.d_mlp
    shapes = {
        "wte.weight": (cfg.d_vocab, d),
        "wpe.weight": (cfg.n_ctx, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        shapes |= {
            p + "ln_1.weight": (d,),
            p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d),
            p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d),
            p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,),
            p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, m),
            p + "mlp.c_fc.bias": (m,),
            p + "mlp.c_proj.weight": (m, d),
            p + "mlp.c_proj.bias": (d,),
        }
    if not tied:
        shapes["lm_head.weight"] = (cfg.d_vocab, d)
    return shapes


def checked_hf_tensors(state: Mapping[str, torch.Tensor], cfg: Config, tied: bool, where: str) -> dict:
    """The GPT-2 tensors under names without the ``transformer.`` prefix, each checked for
    presence and shape (one line naming the tensor as the file names it)."""
    names = gpt2_names({name: tuple(state[name].shape) for name in state}, cfg, tied, where)
    return {name: state[source] for name, source in names.items()}


def gpt2_names(shapes: dict[str, tuple[int, ...]], cfg: Config, tied: bool, where: str) -> dict[str, str]:
    """The source's name of each GPT-2 tensor by its name without the ``transformer.`` prefix,
    the tensors' ``shapes`` (by the source's names) checked: :func:`checked_hf_tensors`."""
    names = {name.removeprefix("transformer."): name for name in shapes if not name.endswith(_IGNORED)}
    if tied:
        names.pop("lm_head.weight", None)  # a tied copy of wte (present in a live model's state dict)
    expected = expected_hf_shapes(cfg, tied)
    for name, shape in expected.items():
        if name not in names:
            raise QkovError(f"{where}: missing tensor {name} (config.json expects {len(expected)} tensors)")
        if shapes[names[name]] != shape:
            raise QkovError(
                f"{where}: tensor {name} has shape {shapes[names[name]]}, config.json expects {shape}"
            )
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        raise QkovError(f"{where}: unexpected tensor {unexpected[0]} (not part of this GPT-2 config)")
    return names


def hf_to_qkov_tensors(tensors: dict[str, torch.Tensor], cfg: Config, tied: bool) -> dict[str, torch.Tensor]:
    """GPT-2's tensors in qkov's names and shapes (see the module docstring)."""
    out = gpt2_ends(tensors.__getitem__, cfg, tied)
    for layer in range(cfg.n_layers):
        out |= gpt2_layer(tensors.__getitem__, cfg, layer)
    return out


def gpt2_ends(get: Callable[[str], torch.Tensor], cfg: Config, tied: bool) -> dict[str, torch.Tensor]:
    """GPT-2's embeddings, final norm and unembedding in qkov's names; ``get`` gives a tensor by
    its name without the ``transformer.`` prefix."""
    return {
        "W_E": get("wte.weight"),
        "W_pos": get("wpe.weight"),
        "ln_final.w": get("ln_f.weight"),
        "ln_final.b": get("ln_f.bias"),
        "W_U": get("wte.weight" if tied else "lm_head.weight").T.contiguous(),
    }


def gpt2_layer(get: Callable[[str], torch.Tensor], cfg: Config, layer: int) -> dict[str, torch.Tensor]:
    """One GPT-2 layer's tensors in qkov's names (``get`` as in :func:`gpt2_ends`)."""
    h, out = cfg.n_heads, {}
    p, q = f"h.{layer}.", f"blocks.{layer}."
    W_Q, W_K, W_V = get(p + "attn.c_attn.weight").chunk(3, dim=1)
    b_Q, b_K, b_V = get(p + "attn.c_attn.bias").chunk(3)
    for name, W, b in (("Q", W_Q, b_Q), ("K", W_K, b_K), ("V", W_V, b_V)):
        out[q + f"attn.W_{name}"] = rearrange(W, "d_model (h e) -> h d_model e", h=h).contiguous()
        out[q + f"attn.b_{name}"] = rearrange(b, "(h e) -> h e", h=h).contiguous()
    out[q + "attn.W_O"] = rearrange(get(p + "attn.c_proj.weight"), "(h e) d -> h e d", h=h).contiguous()
    out[q + "attn.b_O"] = get(p + "attn.c_proj.bias")
    for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
        out[q + f"{ours}.w"], out[q + f"{ours}.b"] = get(p + f"{theirs}.weight"), get(p + f"{theirs}.bias")
    out[q + "mlp.W_in"], out[q + "mlp.b_in"] = get(p + "mlp.c_fc.weight"), get(p + "mlp.c_fc.bias")
    out[q + "mlp.W_out"], out[q + "mlp.b_out"] = get(p + "mlp.c_proj.weight"), get(p + "mlp.c_proj.bias")
    return out


@dataclass(frozen=True)
class Renaming:
    """A source's tensors in qkov's names by its family's adapter: the ends (embedding, positions,
    final norm, unembedding) and one layer at a time, each read when asked for; the same code for a
    model read whole (:meth:`tensors`) and a lazy one (:mod:`qkov.interop.lazy`)."""

    cfg: Config
    ends: Callable[[], dict[str, torch.Tensor]]
    layer: Callable[[int], dict[str, torch.Tensor]]
    finish: Callable[[], None]  # one line for a source tensor no call read

    def tensors(self) -> dict[str, torch.Tensor]:
        out = self.ends()
        for layer in range(self.cfg.n_layers):
            out |= self.layer(layer)
        self.finish()
        return out


def renaming(data: dict, state: Mapping[str, torch.Tensor], where: str, config_where: str) -> Renaming:
    """The :class:`Renaming` of a Hugging Face ``config.json``'s tensors ``state`` (a mapping that
    may read each tensor only when asked for); GPT-2's names and shapes are checked here."""
    family = family_of(data, config_where)
    if family is not None:
        cfg, read = family.config(data, config_where), Reader(state, where)
        return Renaming(
            cfg, partial(family.ends, read, cfg, data), partial(family.layer, read, cfg), read.finish
        )
    cfg = hf_config(data, config_where)
    tied = bool(data.get("tie_word_embeddings", True))
    names = gpt2_names({name: tuple(state[name].shape) for name in state}, cfg, tied, where)

    def get(name: str) -> torch.Tensor:
        return state[names[name]]

    return Renaming(cfg, partial(gpt2_ends, get, cfg, tied), partial(gpt2_layer, get, cfg), lambda: None)


def family_of(data: dict[str, Any], where: str) -> Family | None:
    """The adapter of a ``config.json``'s ``model_type`` (None: GPT-2, read by this module), or one
    line listing the families qkov reads."""
    kind = data.get("model_type", "gpt2")
    if kind == "gpt2":
        return None
    if kind not in FAMILIES:
        known = ", ".join(["gpt2", *sorted(FAMILIES)])
        raise QkovError(f"{where}: model_type {kind!r} is not supported (qkov reads {known})")
    return FAMILIES[kind]


def family_model(
    family: Family, data: dict, state: dict, where: str, config_where: str, tokenizer, fold: bool
):
    """A model of any family but GPT-2: its adapter's config and tensors (every tensor read once)."""
    names = renaming(data, state, where, config_where)
    check_finite(state, where)
    return model_from_source(names.cfg, names.tensors(), where, tokenizer, fold)


def from_hf(model_or_folder: Any, fold: bool = True, config: str | os.PathLike | None = None) -> Transformer:
    """A qkov model from a Hugging Face ``GPT2LMHeadModel``, a folder it saved (``model.safetensors``
    or a pickled ``pytorch_model.bin``, read by :mod:`qkov.pickles`; its ``tokenizer.json``
    carried over) or such a weights file, folded by default (:func:`qkov.interop.fold.fold`);
    ``config`` replaces the ``config.json`` beside the weights. Raises :class:`QkovError` with one
    line for what is missing, broken or unsupported. A folder needs no ``transformers`` installed."""
    if isinstance(model_or_folder, str | os.PathLike):
        source = read_source(model_or_folder, config)
        data, state, tokenizer = source.config, source.tensors, source.tokenizer_folder
        where, config_where = str(source.weights), str(source.config_file)
    else:
        data = model_or_folder.config.to_dict()
        state, tokenizer, where = dict(model_or_folder.state_dict()), None, type(model_or_folder).__name__
        config_where = f"{where} config"
    family = family_of(data, config_where)
    if family is not None:
        return family_model(family, data, state, where, config_where, tokenizer, fold)
    cfg = hf_config(data, config_where)
    tied = bool(data.get("tie_word_embeddings", True))
    tensors = checked_hf_tensors(state, cfg, tied, where)
    check_finite(tensors, where)
    return model_from_source(cfg, hf_to_qkov_tensors(tensors, cfg, tied), where, tokenizer, fold)
