"""A model on its own task (circuits/task.py): loss, accuracy and head ablations against given
targets, checked against dense float64 references; a classifier (``d_vocab_out`` 2) analysed end
to end, the analyses that need a square token-to-token circuit skipped with their reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qkov
from qkov.analyze import analyze
from qkov.circuits.paths import term_importance
from qkov.circuits.task import task_performance
from qkov.cli import main
from qkov.data.user_tokens import IGNORE, next_token_targets, read_user_tokens

from conftest import CLASSIFIER, classifier_data, random_model
from reference import reference_forward


def dense_scores(logits: np.ndarray, targets: np.ndarray) -> tuple[float, float, float]:
    has = targets != IGNORE
    chosen, wanted = logits[has], targets[has]
    log_probs = chosen - np.log(np.exp(chosen - chosen.max(1, keepdims=True)).sum(1, keepdims=True))
    log_probs -= chosen.max(1, keepdims=True)
    target_lp = log_probs[np.arange(len(wanted)), wanted]
    return -target_lp.mean(), (chosen.argmax(1) == wanted).mean(), np.exp(target_lp).mean()


def test_the_task_scores_and_every_ablation_are_the_dense_ones():
    model = random_model(CLASSIFIER, biases=True).double()
    tokens, targets = classifier_data()
    task = task_performance(model, tokens, targets, "test data")
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    logits = reference_forward(weights, CLASSIFIER, tokens.numpy())[0]
    assert logits.shape == (6, 7, 2)
    np.testing.assert_allclose(
        (task.loss, task.accuracy, task.mean_target_probability),
        dense_scores(logits, targets.numpy()),
        atol=1e-12,
    )
    assert (task.sequences, task.positions, task.data) == (6, 6, "test data")
    assert [(a.head, a.mode) for a in task.ablations][:3] == [
        ("L0H0", "zero"),
        ("L0H0", "mean"),
        ("L0H1", "zero"),
    ]
    assert len(task.ablations) == 8
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for ablation in task.ablations:  # each ablation: the dense model with that head's write replaced
        layer, head = int(ablation.head[1]), int(ablation.head[3])
        writes = cache[f"blocks.{layer}.attn.hook_result"][:, :, head]
        # "mean": the head's mean write over the batch, at each position
        value = torch.zeros_like(writes) if ablation.mode == "zero" else writes.mean(0).expand_as(writes)

        def edit(at, w, layer=layer, head=head, value=value):
            if at == layer:
                w = w.clone()
                w[:, :, head] = value
            return w

        ablated = model.run_with_cache(tokens, edit_writes=edit)[0].detach().numpy()
        loss, accuracy, _ = dense_scores(ablated, targets.numpy())
        assert ablation.loss == pytest.approx(loss, abs=1e-12)
        assert ablation.loss_change == pytest.approx(loss - task.loss, abs=1e-12)
        assert ablation.accuracy_change == pytest.approx(accuracy - task.accuracy, abs=1e-12)


def test_a_perfect_task_head_costs_everything_when_ablated():
    """A 1-layer model whose only head copies the previous token to the logits: the task "predict
    the previous token" is solved exactly, and zero-ablating the head leaves the direct path only."""
    cfg = qkov.Config(
        n_layers=1, n_heads=1, d_model=16, d_head=8, d_vocab=8, n_ctx=6, positional_embedding="standard"
    )
    model = qkov.Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_E[:, :8] = torch.eye(8)
        model.W_pos[:, 8:14] = torch.eye(6)[:, :6]
        attn = model.blocks[0].attn
        for d in range(1, 6):  # queries at position d look for position d - 1
            attn.W_Q[0, 8 + d, 0 + (d % 8)] = 40.0
            attn.W_K[0, 8 + d - 1, 0 + (d % 8)] = 1.0
        attn.W_V[0, :8, :8] = torch.eye(8)
        attn.W_O[0, :8, :8] = torch.eye(8) * 30.0
        model.W_U[:8] = torch.eye(8)
    tokens = torch.randint(0, 8, (16, 6), generator=torch.Generator().manual_seed(3))
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 1:] = tokens[:, :-1]
    task = task_performance(model, tokens, targets, "previous token")
    assert task.accuracy == 1.0 and task.loss < 1e-3
    zero = next(a for a in task.ablations if a.mode == "zero")
    assert zero.accuracy < 0.4 and zero.loss_change > 1.0


def test_term_importance_against_the_next_token_given_is_the_default():
    cfg = qkov.Config(n_layers=2, n_heads=2, d_model=12, d_head=4, d_vocab=9, n_ctx=7)
    model = random_model(cfg).double()
    tokens = classifier_data()[0]
    default = term_importance(model, tokens)
    given = term_importance(model, tokens, targets=next_token_targets(tokens))
    np.testing.assert_allclose(given.loss_by_order, default.loss_by_order, rtol=1e-12)
    np.testing.assert_allclose(given.first_order_by_head, default.first_order_by_head, rtol=1e-10, atol=1e-12)


def test_term_importance_of_a_classifier_ends_at_its_task_loss():
    model = random_model(CLASSIFIER, biases=True).double()
    tokens, targets = classifier_data()
    importance = term_importance(model, tokens, "labels", targets)
    task = task_performance(model, tokens, targets, "labels")
    assert importance.loss_by_order[-1] == pytest.approx(task.loss, abs=1e-10)


def test_a_classifier_is_analysed_end_to_end(tmp_path, capsys):
    model = random_model(CLASSIFIER, biases=True)
    tokens, targets = classifier_data(batch=10)
    qkov.save(model, tmp_path / "ckpt")
    np.save(tmp_path / "x.npy", tokens.numpy())
    torch.save(targets, tmp_path / "y.pt")
    data = ["--tokens", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.pt")]
    main(["analyze", str(tmp_path / "ckpt"), *data, "--out", str(tmp_path / "out"), "--quiet"])
    results = qkov.load_results(tmp_path / "out" / "results.json")
    ran = {name for name in ("spectra", "attention_examples", "qk_position_content", "term_importance",
                             "composition", "task") if getattr(results, name) is not None}  # fmt: skip
    assert ran == {
        "spectra",
        "attention_examples",
        "qk_position_content",
        "term_importance",
        "composition",
        "task",
    }
    square = {
        "copying_direct",
        "copying",
        "copying_comparison",
        "repeated_tokens",
        "induction_check",
        "induction_mechanism",
        "correction",
        "circuit",
        "ablation",
        "ablation_estimate",
    }
    assert set(results.skipped) == square | {
        "bigram",
        "skip_trigrams",
        "neurons",
        "rotary_bands",
        "gqa_groups",
    }
    assert all("square token-to-token circuit" in results.skipped[name] for name in square)
    assert all(getattr(results, name) is None for name in results.skipped)
    user = read_user_tokens(tmp_path / "x.npy", tmp_path / "y.pt", model.cfg)
    expected = task_performance(model, user.tokens, user.targets, user.description)
    assert results.task == expected and "x.npy (10 x 7 tokens; targets y.pt)" in results.task.data
    assert results.term_importance.tokens == user.description
    assert results.attention_examples.user.tokens == tokens[0].tolist()
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"loss {expected.loss:.4f} nats" in err
    reason = results.skipped["copying"]  # one line per reason, naming every step it skipped
    assert f"skipped ({reason}): " in err and err.count(f"skipped ({reason})") == 1
    html = (tmp_path / "out" / "report.html").read_text()
    assert "The model on its own task" in html and "Analyses that did not apply" in html


def test_a_transformer_lens_classifier_imports_and_agrees(tmp_path):
    pytest.importorskip("transformer_lens")
    from qkov.interop import from_transformer_lens, to_hooked_transformer

    model = random_model(CLASSIFIER, biases=True).double()
    hooked = to_hooked_transformer(model)
    assert hooked.cfg.d_vocab_out == 2
    back = from_transformer_lens(hooked, fold=False)
    assert back.cfg.d_vocab_out == 2 and back.W_U.shape == (12, 2)
    tokens = classifier_data()[0]
    with torch.no_grad():
        np.testing.assert_allclose(back.double()(tokens).numpy(), hooked(tokens).numpy(), atol=1e-10)


def test_analyze_without_the_users_data_says_what_a_classifier_needs():
    results = analyze(random_model(CLASSIFIER), show_progress=False)
    assert results.task is None and results.term_importance is None
    assert results.skipped["task"] == "needs the user's data (--tokens)"
    assert "give them (--tokens, --targets)" in results.skipped["term_importance"]
