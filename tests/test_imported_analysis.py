"""`qkov analyze` on imported models: a hand-built LayerNorm model's heads are found after a
round trip through TransformerLens' format, and a random GPT-2 folder is analysed end to end."""

from __future__ import annotations

import logging

import pytest
import torch

import qkov
from qkov.cli import main
from qkov.interop import save_transformer_lens, to_hooked_transformer

from handbuilt import induction_model, with_layer_norm

pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
logging.getLogger("transformer_lens").setLevel(logging.ERROR)


def import_and_analyze(src, tmp_path, *flags):
    main(["import", str(src), "--out", str(tmp_path / "qkov"), *flags])
    main(["analyze", str(tmp_path / "qkov"), "--out", str(tmp_path / "analysis"), "--quiet"])
    assert (tmp_path / "analysis" / "report.html").stat().st_size > 0
    return qkov.load_results(tmp_path / "analysis" / "results.json")


@pytest.mark.parametrize("fold", [True, False])
def test_a_hand_built_layer_norm_model_keeps_its_heads_through_import(tmp_path, fold):
    model = with_layer_norm(induction_model())
    tokens = torch.randperm(63, generator=torch.Generator().manual_seed(0))[:4].add(1).repeat(3)[None]
    predicted = model(tokens).argmax(-1)[0, 4:]  # after the first repeat: the same predictions
    assert torch.equal(predicted, induction_model()(tokens).argmax(-1)[0, 4:])
    assert torch.equal(predicted[:-1], tokens[0, 5:])
    save_transformer_lens(to_hooked_transformer(model), tmp_path / "tl")
    results = import_and_analyze(tmp_path / "tl", tmp_path, *([] if fold else ["--no-fold"]))
    config = results.config
    assert config.source == "transformer_lens"
    assert config.normalization == ("LNPre" if fold else "LN") and config.d_mlp == 0
    heads = {h.name: h for h in results.repeated_tokens.heads}
    assert heads["L0H0"].previous_token_score > 0.99
    assert heads["L1H0"].induction_score > 0.85
    for other in ("L0H1", "L1H0", "L1H1"):
        assert heads[other].previous_token_score < 0.5
    for other in ("L0H0", "L0H1", "L1H1"):
        assert heads[other].induction_score < 0.3
    copying = {h.name: h for h in results.copying.heads}
    assert copying["L1H0"].copying_score == pytest.approx(1.0, abs=1e-6)
    check = {row.head: row for row in results.induction_check}
    assert check["L1H0"].writer == "L0H0"
    assert check["L1H0"].k_composition_positivity == pytest.approx(1.0, abs=1e-6)
    top = max(results.composition.K, key=lambda p: p.score)
    assert (top.writer, top.reader) == ("L0H0", "L1H0") and top.score > 0
    _, second, third = results.repeated_tokens.loss_per_repeat
    assert second < 1.0 and third < 1.0
    # the frozen-scale path expansion still sums to the imported model's logits
    imported = qkov.load(tmp_path / "qkov").double()
    terms = qkov.path_expansion(imported, tokens)
    torch.testing.assert_close(sum(terms.values()), imported(tokens), rtol=1e-10, atol=1e-10)


def test_a_random_gpt2_folder_is_analysed_end_to_end(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3, n_head=4, n_embd=32, vocab_size=40, n_positions=24, bos_token_id=0, eos_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2", safe_serialization=True)
    results = import_and_analyze(tmp_path / "gpt2", tmp_path)
    config = results.config
    assert (config.source, config.normalization, config.d_mlp, config.act_fn) == (
        "huggingface",
        "LNPre",
        128,
        "gelu_new",
    )
    assert len(results.repeated_tokens.heads) == 12 and len(results.induction_check) == 8
    assert len(results.composition.K) == 4 * 4 * 3  # pairs (earlier layer, later layer)
    assert len(results.spectra.OV) == 12 and all(d.exact for d in results.copying_direct)
    losses = results.term_importance.loss_by_order
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses)
