"""TransformerLens habits on a qkov model (``to_tokens``, the cache's short keys and stacks,
``run_with_hooks``), each checked against TransformerLens 3 running the same model: activation
patching as the ARENA notebooks do it (the residual stream at every layer and position, then every
head's output, from a clean run into a corrupted one, scored by a logit difference) with the very
same hook functions in both libraries."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import qkov
from qkov.data.tokenizer import train_tokenizer
from qkov.hooks import HookPoint
from qkov.names import hook_points

from conftest import random_model

transformers = pytest.importorskip("transformers")
tl = pytest.importorskip("transformer_lens")
transformers.logging.set_verbosity_error()

TOLERANCE = 1e-8  # float64 in both libraries: measured agreement 1e-14 on these models
TEXTS = ["def f(x):\n    return x + 1\n", "the cat sat on the mat", "When John and Mary went to the shops"]
SHORTFORMER = qkov.Config(n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=300, n_ctx=24)
WITH_MLP = qkov.Config(
    n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=300, n_ctx=24,
    positional_embedding="standard", normalization="LN", d_mlp=64,
)  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS * 20, 300)


def _pair(cfg: qkov.Config, tokenizer, biases: bool):
    """The qkov model (float64, with the tokenizer) and the same model in TransformerLens."""
    model = random_model(cfg, seed=3, biases=biases).double().eval().requires_grad_(False)
    model.tokenizer = tokenizer
    hooked = qkov.interop.to_hooked_transformer(model)
    with tempfile.TemporaryDirectory() as folder:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
        )  # fmt: skip
        fast.save_pretrained(folder)  # TransformerLens re-reads its tokenizer by name
        hooked.set_tokenizer(transformers.AutoTokenizer.from_pretrained(folder), default_padding_side="right")
    return model, hooked


@pytest.fixture(scope="module", params=["shortformer", "with_mlp"])
def pair(request, tokenizer):
    if request.param == "shortformer":
        return _pair(SHORTFORMER, tokenizer, biases=False)
    return _pair(WITH_MLP, tokenizer, biases=True)


def test_text_in_and_out_as_transformer_lens(pair):
    model, hooked = pair
    texts = ["the cat sat", "When John and Mary went"]
    for bos in (True, False):
        assert torch.equal(model.to_tokens(texts, prepend_bos=bos), hooked.to_tokens(texts, prepend_bos=bos))
        assert model.to_str_tokens("the cat sat", prepend_bos=bos) == hooked.to_str_tokens(
            "the cat sat", prepend_bos=bos
        )
    tokens = model.to_tokens("def f(x): return x", prepend_bos=True)
    assert model.to_string(tokens[0]) == hooked.to_string(tokens[0]) == "<|endoftext|>def f(x): return x"
    assert model.to_string(model.to_tokens(texts[1], prepend_bos=False)[0]) == texts[1]
    # a piece that is not whole characters reads as its bytes (TransformerLens: two identical "\ufffd")
    assert model.to_str_tokens("é", prepend_bos=False) == ["<C3>", "<A9>"]
    assert model.cfg.bos_token_id is None and model.to_tokens("the cat").shape == (1, 2)  # as trained
    torch.testing.assert_close(model("the cat sat"), model(model.to_tokens("the cat sat")))


def test_text_needs_a_tokenizer():
    model = random_model(SHORTFORMER)
    with pytest.raises(qkov.QkovError, match="no tokenizer"):
        model.run_with_cache("the cat")


def test_every_cached_activation_is_transformer_lens(pair):
    model, hooked = pair
    tokens = model.to_tokens(TEXTS[2], prepend_bos=True)
    logits, cache = model.run_with_cache(tokens)
    theirs_logits, theirs = hooked.run_with_cache(tokens)
    torch.testing.assert_close(logits, theirs_logits, rtol=0, atol=TOLERANCE)
    assert list(cache) == hook_points(model.cfg)
    for name in cache:
        torch.testing.assert_close(cache[name], theirs[name], rtol=0, atol=TOLERANCE, msg=name)


def test_names_filter_keeps_what_transformer_lens_keeps(pair):
    """``run_with_cache(names_filter=...)`` as TransformerLens takes it (a name, a list, a function):
    the same logits bit for bit, and the cache holds the named activations, equal to theirs."""
    model, hooked = pair
    tokens = model.to_tokens(TEXTS[2], prepend_bos=True)
    full_logits, _ = model.run_with_cache(tokens)
    for names_filter in (
        "blocks.1.attn.hook_pattern",
        ["hook_embed", "blocks.0.attn.hook_result"],
        lambda name: name.endswith("hook_pattern"),
    ):
        logits, cache = model.run_with_cache(tokens, names_filter=names_filter)
        _, theirs = hooked.run_with_cache(tokens, names_filter=names_filter)
        assert torch.equal(logits, full_logits)
        assert sorted(cache) == sorted(theirs.keys()) and len(cache) >= 1
        for name in cache:
            torch.testing.assert_close(cache[name], theirs[name], rtol=0, atol=TOLERANCE, msg=name)
    # a name that is no hook point is an error here (TransformerLens caches nothing for it)
    with pytest.raises(qkov.QkovError, match="no hook point 'blocks.0.hook_resid'"):
        model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid"])
    with pytest.raises(qkov.QkovError, match="names_filter is a hook name, a list of them"):
        model.run_with_cache(tokens, names_filter=3)


def test_return_type_none_runs_for_the_cache_alone(pair):
    """``run_with_cache(return_type=None)``, as TransformerLens takes it: no logits, the same cache
    as theirs and as a run that unembeds (the final norm's scale included)."""
    model, hooked = pair
    tokens = model.to_tokens(TEXTS[0], prepend_bos=True)
    _, full = model.run_with_cache(tokens)
    logits, cache = model.run_with_cache(tokens, return_type=None)
    theirs_logits, theirs = hooked.run_with_cache(tokens, return_type=None)
    assert logits is None and theirs_logits is None
    assert list(cache) == list(full)  # a final norm's scale included, where the model has one
    for name in cache:
        assert torch.equal(cache[name], full[name]), name
        torch.testing.assert_close(cache[name], theirs[name], rtol=0, atol=TOLERANCE, msg=name)
    with pytest.raises(qkov.QkovError, match="return_type: \"logits\" or None, not 'loss'"):
        model.run_with_cache(tokens, return_type="loss")


def test_the_cache_reads_transformer_lens_short_keys(pair):
    model, hooked = pair
    _, cache = model.run_with_cache(model.to_tokens(TEXTS[1]))
    assert cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"] is cache["pattern", -1]
    assert cache["resid_pre", 0] is cache["blocks.0.hook_resid_pre"]
    assert cache["z", 0] is cache["blocks.0.attn.hook_z"] and cache["result1"] is cache["result", 1]
    assert cache["embed"] is cache["hook_embed"]
    if model.cfg.has_layer_norm:
        assert cache["scale"] is cache["ln_final.hook_scale"]
        assert cache["scale", 0, "ln1"] is cache["blocks.0.ln1.hook_scale"] is cache["scale0ln1"]
    with pytest.raises(KeyError, match="no activation 'blocks.0.attn.hook_q'"):
        cache["q", 0]
    with pytest.raises(qkov.QkovError, match="blocks.5.hook_resid_pre"):
        cache["resid_pre", 5]
    assert isinstance(cache, dict) and "pattern" not in cache  # still a dict of full names


def _assert_same_stack(ours, theirs):
    (a, a_labels), (b, b_labels) = ours, theirs
    assert a_labels == b_labels
    if b.numel() == 0:  # TransformerLens' empty stack is float32 whatever the model; ours keeps its dtype
        assert a.shape == b.shape and a.dtype == torch.float64
        return
    torch.testing.assert_close(a, b, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("layer", [None, -1, 2, 1, 0])
def test_accumulated_resid_and_head_stacks_as_transformer_lens(pair, layer):
    model, hooked = pair
    tokens = model.to_tokens(TEXTS[:2], prepend_bos=True)
    _, ours = model.run_with_cache(tokens)
    _, theirs = hooked.run_with_cache(tokens)
    for incl_mid in (False, True) if model.cfg.has_mlp else (False,):  # no resid_mid without MLPs
        for apply_ln in (False, True):
            for mlp_input in (False, True) if model.cfg.has_mlp else (False,):
                options = dict(incl_mid=incl_mid, apply_ln=apply_ln, mlp_input=mlp_input, return_labels=True)
                if mlp_input and layer in (None, -1, 2):
                    continue  # no resid_mid after the last layer
                _assert_same_stack(
                    ours.accumulated_resid(layer, **options), theirs.accumulated_resid(layer, **options)
                )
    for incl_remainder in (False, True) if layer != 0 else (False,):
        for apply_ln in (False, True):
            options = dict(incl_remainder=incl_remainder, apply_ln=apply_ln, return_labels=True)
            stack = layer if layer is not None else -1
            _assert_same_stack(
                ours.stack_head_results(stack, **options), theirs.stack_head_results(stack, **options)
            )
    heads, labels = ours.stack_head_results(return_labels=True)
    assert labels[5] == "L1H1" and heads.shape == (8, *tokens.shape, model.cfg.d_model)
    # before layer 0 the remainder is the stream entering it (TransformerLens reads resid_post of layer
    # -1, the final stream, there)
    nothing, labels = ours.stack_head_results(0, incl_remainder=True, return_labels=True)
    assert labels == ["remainder"] and torch.equal(nothing[0], ours["resid_pre", 0])


@pytest.mark.parametrize("mode", ["all", "attn", "mlp"])
def test_decompose_resid_sums_to_the_stream_as_transformer_lens(pair, mode):
    model, hooked = pair
    tokens = model.to_tokens(TEXTS[0], prepend_bos=True)
    _, ours = model.run_with_cache(tokens)
    _, theirs = hooked.run_with_cache(tokens)
    parts = ours.decompose_resid(mode="all")
    torch.testing.assert_close(parts.sum(0), ours["resid_post", -1], rtol=0, atol=1e-12)
    if model.cfg.positional_embedding != "standard":
        # TransformerLens lists the shortformer's positions too, which never join the stream
        assert "pos_embed" in theirs.decompose_resid(return_labels=True)[1]
        assert "pos_embed" not in ours.decompose_resid(return_labels=True)[1]
        return
    for layer in (None, 1, 0):
        for apply_ln in (False, True):
            for mlp_input in (False, True) if layer is not None else (False,):
                options = dict(mode=mode, apply_ln=apply_ln, mlp_input=mlp_input, return_labels=True)
                _assert_same_stack(
                    ours.decompose_resid(layer, **options), theirs.decompose_resid(layer, **options)
                )


def _clean_and_corrupted(model):
    """Two prompts of equal length that differ in one token (position 3), and two answer tokens."""
    clean = model.to_tokens(["When John and Mary went", "the cat sat on the"], prepend_bos=True)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 7) % model.cfg.d_vocab
    return clean, corrupted, torch.tensor([5, 17]), torch.tensor([40, 71])


def _logit_diff(logits, right, wrong):
    last = logits[:, -1]
    return (last.gather(1, right[:, None]) - last.gather(1, wrong[:, None])).mean()


def _patching(run, clean_cache, corrupted, n_layers, n_pos, right, wrong):
    """ARENA's residual-stream patching: every (layer, position), one run each. The same code runs
    both libraries: ``run(tokens, fwd_hooks)`` is their ``run_with_hooks``."""
    out = torch.zeros(n_layers, n_pos, dtype=torch.float64)
    for layer in range(n_layers):
        name = f"blocks.{layer}.hook_resid_pre"
        for pos in range(n_pos):

            def patch(resid, hook, pos=pos):
                resid[:, pos] = clean_cache[hook.name][:, pos]
                return resid

            out[layer, pos] = _logit_diff(run(corrupted, fwd_hooks=[(name, patch)]), right, wrong)
    return out


def test_residual_stream_patching_agrees_with_transformer_lens(pair):
    model, hooked = pair
    clean, corrupted, right, wrong = _clean_and_corrupted(model)
    clean_logits, ours_cache = model.run_with_cache(clean)
    _, theirs_cache = hooked.run_with_cache(clean)
    n_pos = clean.shape[1]
    ours = _patching(model.run_with_hooks, ours_cache, corrupted, 2, n_pos, right, wrong)
    theirs = _patching(hooked.run_with_hooks, theirs_cache, corrupted, 2, n_pos, right, wrong)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOLERANCE)
    # what patching must show, whichever library: the changed token's stream restores the clean run
    clean_diff = _logit_diff(clean_logits, right, wrong)
    corrupted_diff = _logit_diff(model(corrupted), right, wrong)
    assert abs(float(clean_diff - corrupted_diff)) > 1e-3
    torch.testing.assert_close(ours[0, 3], clean_diff, rtol=0, atol=1e-10)
    others = torch.cat([ours[0, :3], ours[0, 4:]])  # before layer 0 only the changed position differs
    torch.testing.assert_close(others, corrupted_diff.expand_as(others), rtol=0, atol=1e-10)


@pytest.mark.parametrize("hook", ["z", "result"])
def test_head_output_patching_agrees_with_transformer_lens(pair, hook):
    model, hooked = pair
    clean, corrupted, right, wrong = _clean_and_corrupted(model)
    _, ours_cache = model.run_with_cache(clean)
    _, theirs_cache = hooked.run_with_cache(clean)

    def every_head(run, clean_cache):
        out = torch.zeros(2, model.cfg.n_heads, dtype=torch.float64)
        for layer in range(2):
            for head in range(model.cfg.n_heads):

                def patch(act, hook, head=head):
                    act[:, :, head] = clean_cache[hook.name][:, :, head]

                hooks = [(f"blocks.{layer}.attn.hook_{hook}", patch)]
                out[layer, head] = _logit_diff(run(corrupted, fwd_hooks=hooks), right, wrong)
        return out

    ours = every_head(model.run_with_hooks, ours_cache)
    theirs = every_head(hooked.run_with_hooks, theirs_cache)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOLERANCE)
    assert float((ours - _logit_diff(model(corrupted), right, wrong)).abs().max()) > 1e-3  # heads matter


def test_hooks_that_return_nothing_change_nothing(pair):
    model, _ = pair
    tokens = model.to_tokens(TEXTS[:2])
    seen: list[str] = []
    every = (lambda name: True, lambda act, hook: seen.append(hook.name))
    logits = model.run_with_hooks(tokens, fwd_hooks=[every])
    assert seen == hook_points(model.cfg)
    assert torch.equal(logits, model.run_with_cache(tokens)[0])
    torch.testing.assert_close(logits, model(tokens), rtol=0, atol=1e-12)


def test_a_hook_replaces_what_every_later_reader_sees(pair):
    """Zeroing layer 0's write (its ``attn_out``) is zero-ablating every head of layer 0, as
    ``edit_writes`` does, and the hooked run's cache shows the zeros; a filter hooks every layer."""
    model, _ = pair
    tokens = model.to_tokens(TEXTS[:2])
    zero = [("blocks.0.hook_attn_out", lambda out, hook: torch.zeros_like(out))]
    logits, cache = model.run_with_cache(tokens, fwd_hooks=zero)
    assert cache["attn_out", 0].abs().max() == 0
    if model.has_biases:  # b_O stays in edit_writes' ablation
        return
    ablated, _ = model.run_with_cache(tokens, edit_writes=lambda layer, w: w * (layer != 0))
    torch.testing.assert_close(logits, ablated, rtol=0, atol=1e-12)
    names: list[str] = []
    patterns = (lambda name: name.endswith("hook_pattern"), lambda p, hook: names.append(hook.name))
    model.run_with_hooks(tokens, fwd_hooks=[patterns])
    assert names == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


def test_bad_hooks_are_one_line(pair):
    model, _ = pair
    tokens = model.to_tokens(TEXTS[1])
    with pytest.raises(qkov.QkovError, match="no hook point 'blocks.0.hook_resid'"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid", lambda a, hook: None)])
    with pytest.raises(qkov.QkovError, match=r"returned \(3,\): expected a tensor of shape"):
        model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda a, hook: torch.zeros(3))])
    with pytest.raises(qkov.QkovError, match="belongs to no block"):
        HookPoint("hook_embed").layer()
    assert HookPoint("blocks.1.attn.hook_z").layer() == 1


def test_a_hook_cannot_write_into_the_weights(pair):
    model, _ = pair
    if model.W_pos is None:
        return
    before = model.W_pos.clone()

    def scribble(pos, hook):
        pos[:] = 7.0

    model.run_with_hooks(model.to_tokens(TEXTS[1]), fwd_hooks=[("hook_pos_embed", scribble)])
    assert torch.equal(model.W_pos, before)


def test_qkov_analyze_is_the_command(tmp_path):
    """``qkov.analyze`` is callable from the top level (on a model, or a folder as the command reads
    it: its training log too) and gives the Results ``qkov analyze`` writes; the module stays
    importable as before (``from qkov import analyze; analyze.run_steps``)."""
    from qkov import analyze
    from qkov.cli import main
    from qkov.results import to_json

    from handbuilt import induction_model

    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    (folder / "metrics.jsonl").write_text('{"step": 10, "tokens": 640, "train_loss": 3.5}\n')
    main(["analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
    written = qkov.load_results(tmp_path / "out" / "results.json")
    from_folder = qkov.analyze(folder, show_progress=False)
    assert to_json(from_folder) == to_json(written) and len(from_folder.training) == 1
    from_model = qkov.analyze(qkov.load(folder), show_progress=False)
    assert from_model.training == [] and from_model.composition == written.composition
    assert callable(analyze.run_steps) and analyze.analyze is not qkov.analyze


def test_the_page_example_runs(pair):
    """docs/from-transformerlens.md's patching example, as written there."""
    model, _ = pair
    page = (Path(__file__).resolve().parent.parent / "docs" / "from-transformerlens.md").read_text()
    block = page.split("```python\n# activation patching")[1].split("```")[0]
    namespace = {"model": model, "torch": torch, "qkov": qkov}
    exec("# activation patching" + block, namespace)
    assert namespace["results"].shape == (model.cfg.n_layers, namespace["clean"].shape[1])
