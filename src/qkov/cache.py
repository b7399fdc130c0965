"""The activations of one run, indexed as TransformerLens indexes its ``ActivationCache``.

Section "Residual Stream": the stream entering layer ``l`` is the embedding plus every earlier
layer's write, so it can be read as it accumulates (:meth:`ActivationCache.accumulated_resid`, the
logit lens), split into what each component wrote (:meth:`ActivationCache.decompose_resid`), or
into what each head wrote (:meth:`ActivationCache.stack_head_results`, section "Attention Heads are
Independent and Additive"). The cache is a ``dict`` keyed by full hook names, so code that reads
``cache["blocks.1.attn.hook_pattern"]`` keeps working; it also reads TransformerLens' short keys
(``cache["pattern", 1]``, ``cache["resid_pre", 0]``, ``cache["scale", 0, "ln1"]``, ``cache["k6"]``).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from qkov.config import Config
from qkov.errors import QkovError
from qkov.names import act_name, head_name, hook_name, norm_name, scale_hook


class MissingActivation(QkovError, KeyError):
    """A key the cache does not hold: a :class:`QkovError` and, as a dict's, a ``KeyError``."""

    def __str__(self) -> str:
        return str(self.args[0])


class ActivationCache(dict):
    """Every activation of a run by its TransformerLens hook name (``dict[str, Tensor]``), with the
    model's config and final norm (not the model: the cache keeps no weights alive but that norm's)."""

    def __init__(
        self, activations: dict[str, Tensor], cfg: Config, ln_final: nn.Module | None = None
    ) -> None:
        super().__init__(activations)
        self.cfg, self.ln_final = cfg, ln_final

    def __getitem__(self, key: str | tuple) -> Tensor:
        if isinstance(key, str) and dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if isinstance(key, str):
            name = act_name(key)
        elif isinstance(key, tuple) and key and isinstance(key[0], str) and len(key) <= 3:
            layer = key[1] if len(key) > 1 else None
            if isinstance(layer, int) and layer < 0:
                layer += self.cfg.n_layers
            name = act_name(key[0], layer, key[2] if len(key) > 2 else None)
        else:
            raise MissingActivation(f"a cache key is a hook name or (name, layer[, sublayer]), got {key!r}")
        if not dict.__contains__(self, name):
            held = ", ".join(self)
            raise MissingActivation(f"no activation {name!r} in the cache (it holds {len(self)}: {held})")
        return dict.__getitem__(self, name)

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self)}"

    def _last(self, layer: int | None) -> int:
        """TransformerLens' ``layer``: None or -1 mean after the last layer (``n_layers``)."""
        n = self.cfg.n_layers
        layer = n if layer is None or layer == -1 else layer
        if not 0 <= layer <= n:
            raise QkovError(f"layer must lie in [0, {n}] or be -1 or None, got {layer}")
        return layer

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> Float[Tensor, "components batch pos d_model"] | tuple[Tensor, list[str]]:
        """The residual stream as it accumulates: ``resid_pre`` of every layer before ``layer`` and
        of ``layer`` itself (labels ``"0_pre"``, ...; with ``incl_mid`` also each earlier layer's
        ``resid_mid``, ``"0_mid"``; with ``mlp_input`` that of ``layer``), and with ``layer`` None,
        -1 or ``n_layers`` the final stream (``"final_post"``). ``apply_ln``: each through the final
        norm recomputed on it (the logit lens) at the end, else scaled by ``layer``'s cached scale."""
        layer = self._last(layer)
        parts, labels = [], []
        for i in range(layer + 1):
            if i == self.cfg.n_layers:
                parts.append(self[hook_name(i - 1, "resid_post")])
                labels.append("final_post")
                continue
            parts.append(self[hook_name(i, "resid_pre")])
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                parts.append(self[hook_name(i, "resid_mid")])
                labels.append(f"{i}_mid")
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, recompute_ln=layer == self.cfg.n_layers)
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Float[Tensor, "components batch pos d_model"] | tuple[Tensor, list[str]]:
        """The stream entering ``layer`` (None or -1: the final one) as the writes that sum to it:
        ``"embed"``, ``"pos_embed"`` (standard positions only: shortformer positions never join the
        stream), then each earlier layer's ``"{l}_attn_out"`` and ``"{l}_mlp_out"`` (``mode``
        ``"attn"`` or ``"mlp"`` keeps one kind); ``mlp_input`` adds ``layer``'s own attention."""
        if mode not in ("all", "mlp", "attn"):
            raise QkovError(f"mode must be 'all', 'mlp' or 'attn', got {mode!r}")
        layer = self._last(layer)
        with_attn, with_mlp = mode != "mlp", mode != "attn" and self.cfg.has_mlp
        names: list[tuple[str, str]] = []
        if incl_embeds and "hook_embed" in self:
            names.append(("embed", "hook_embed"))
        if incl_embeds and "hook_pos_embed" in self and self.cfg.positional_embedding == "standard":
            names.append(("pos_embed", "hook_pos_embed"))
        for i in range(layer):
            names += [(f"{i}_attn_out", hook_name(i, "attn_out"))] if with_attn else []
            names += [(f"{i}_mlp_out", hook_name(i, "mlp_out"))] if with_mlp else []
        if mlp_input and with_attn:
            names.append((f"{layer}_attn_out", hook_name(layer, "attn_out")))
        if not names:
            raise QkovError("decompose_resid: nothing to decompose (no embeddings and no layers)")
        stack = torch.stack([self[name] for _, name in names])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input)
        labels = [label for label, _ in names]
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int | None = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
    ) -> Float[Tensor, "heads batch pos d_model"] | tuple[Tensor, list[str]]:
        """Every head's write (``hook_result``) in the layers before ``layer`` (-1 or None: all),
        stacked along a first axis of ``layer * n_heads`` labelled ``L{l}H{h}``; ``incl_remainder``
        adds the rest of the stream after layer ``layer - 1`` (embeddings, biases, MLPs)."""
        layer = self._last(layer)
        labels = [head_name(i, h) for i in range(layer) for h in range(self.cfg.n_heads)]
        heads = [self[hook_name(i, "result")].movedim(-2, 0) for i in range(layer)]
        first = self[hook_name(0, "resid_pre")]
        stack = torch.cat(heads) if heads else first.new_zeros((0, *first.shape))
        if incl_remainder:  # at layer 0 the stream entering it (TransformerLens: the final stream)
            total = self[hook_name(layer - 1, "resid_post")] if layer else first
            stack = torch.cat([stack, (total - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        stack: Float[Tensor, "components batch pos d_model"],
        layer: int | None = None,
        mlp_input: bool = False,
        recompute_ln: bool = False,
    ) -> Float[Tensor, "components batch pos d_model"]:
        """Each component as ``layer``'s norm sees it (appendix "Handling Layer Normalization"):
        centred (LayerNorm) and divided by the whole stream's cached scale, without the norm's weight
        and bias (which fold into the next weights); ``layer`` ``n_layers`` is the final norm. With
        ``recompute_ln`` at the final norm, the whole final norm recomputed on each component."""
        if not self.cfg.has_layer_norm:
            return stack
        layer = self._last(layer)
        if recompute_ln and layer == self.cfg.n_layers and self.ln_final is not None:
            return torch.stack([self.ln_final(part) for part in stack])
        if not self.cfg.is_rms:
            stack = stack - stack.mean(-1, keepdim=True)
        at_end = layer == self.cfg.n_layers
        norm = norm_name(None if at_end else layer, "ln2" if mlp_input else "ln1")
        return stack / self[scale_hook(norm)]
