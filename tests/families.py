"""Tiny random models of every Hugging Face family qkov reads, built by ``transformers`` from each
family's own ``Config`` class (no download), and ``transformers``' own float64 forward: the oracle.

``transformers`` computes RMSNorm, rotary angles and the softmax in float32 even in a float64 model
(``hidden_states.to(torch.float32)``, ``position_ids.float()``, ``softmax(dtype=torch.float32)``);
:class:`Float64` runs its forward with every such float32 island kept in float64, so that the oracle
is the family's own code in float64 throughout."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

NARROW = (torch.float32, torch.float16, torch.bfloat16)


class Float64(TorchFunctionMode):
    """Every float32 (or half) dtype asked for inside the block becomes float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") in NARROW:
            kwargs["dtype"] = torch.float64
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16):
            return args[0].double()
        if func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(torch.float64 if a in NARROW else a for a in args)
        return func(*args, **kwargs)


SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
)
SEQ = 12  # longer than every window below, so the windows bind


def family_configs():
    """``(name, transformers config)`` for every family and option the tests exercise."""
    import transformers as t

    llama = dict(SMALL, num_key_value_heads=2)
    return [
        ("llama", t.LlamaConfig(**llama)),
        (
            "llama-rope-llama3",
            t.LlamaConfig(
                **llama,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            ),
        ),
        (
            "llama-rope-linear",
            t.LlamaConfig(**llama, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}),
        ),
        ("llama-mqa-bias", t.LlamaConfig(**SMALL, num_key_value_heads=1, attention_bias=True, mlp_bias=True)),
        ("mistral", t.MistralConfig(**llama, sliding_window=5, head_dim=8)),
        ("qwen2", t.Qwen2Config(**llama, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
        ("qwen3", t.Qwen3Config(**llama, head_dim=8)),
        ("gemma", t.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=8)),
        (
            "gemma2",
            t.Gemma2Config(
                **llama,
                head_dim=8,
                sliding_window=4,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                query_pre_attn_scalar=16,
            ),
        ),
        (
            "gemma3_text",
            t.Gemma3TextConfig(
                **llama,
                head_dim=8,
                sliding_window=4,
                query_pre_attn_scalar=16,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
        ("olmo2", t.Olmo2Config(**llama)),
        (
            "phi3",
            t.Phi3Config(
                **llama,
                sliding_window=5,
                pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
            ),
        ),
        ("starcoder2", t.Starcoder2Config(**llama, sliding_window=5)),
        ("gpt_neox", t.GPTNeoXConfig(**SMALL, rotary_pct=0.5)),
        ("gpt_neox-sequential", t.GPTNeoXConfig(**SMALL, use_parallel_residual=False)),
        ("gptj", t.GPTJConfig(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4)),
        (
            "gpt_neo",
            t.GPTNeoConfig(
                vocab_size=61,
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                max_position_embeddings=64,
                attention_types=[[["global", "local"], 1]],
                window_size=4,
            ),
        ),
        (
            "opt",
            t.OPTConfig(
                vocab_size=61,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                ffn_dim=48,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
                pad_token_id=1,
            ),
        ),
        ("gpt_bigcode", t.GPTBigCodeConfig(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        (
            "gpt_bigcode-mha",
            t.GPTBigCodeConfig(
                vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=False
            ),
        ),
        (
            "gpt2-inverse-layer",
            t.GPT2Config(
                vocab_size=61,
                n_embd=32,
                n_layer=2,
                n_head=4,
                n_positions=64,
                scale_attn_by_inverse_layer_idx=True,
            ),
        ),
    ]


def random_hf_model(config, seed: int = 0):
    """A ``transformers`` causal LM of ``config`` in float64, every weight drawn at random (norms'
    weights around 1) so that no option hides behind an initial value of 0 or 1."""
    import transformers as t

    config._attn_implementation = "eager"  # output_attentions: the patterns themselves
    torch.manual_seed(seed)
    model = t.AutoModelForCausalLM.from_config(config).double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.3
            centre = 1.0 if param.ndim == 1 and "norm" in name and "bias" not in name else 0.0
            if "gemma" in config.model_type and param.ndim == 1 and "norm" in name:
                centre = 0.0  # Gemma's norms hold w - 1
            param.copy_(noise + centre)
    return model


def oracle(model, tokens):
    """``transformers``' float64 log-probabilities and attention patterns on ``tokens``."""
    with torch.no_grad(), Float64():
        out = model(tokens, output_attentions=True)
    return out.logits.log_softmax(-1), [a for a in out.attentions]
