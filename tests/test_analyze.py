"""Every analysis finds exactly what the hand-built models plant; `qkov analyze` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import qkov
from handbuilt import induction_model, pointer_arithmetic_model, skip_trigram_model, two_back_model
from qkov.analyze import analyze, phase_change
from qkov.circuits.ablation import run_ablated
from qkov.circuits.bigrams import BigramCounts, compare_bigrams
from qkov.circuits.copying import copying_analysis
from qkov.circuits.heads import induction_scores
from qkov.circuits.skip_trigrams import (
    head_circuits,
    skip_trigram_bugs,
    skip_trigram_occurs,
    strongest_skip_trigrams,
)
from qkov.cli import main


@pytest.fixture(scope="module")
def induction_results():
    torch.manual_seed(0)
    return analyze(induction_model(), show_progress=False)


def test_the_previous_token_head_and_the_induction_head_are_found(induction_results):
    heads = {h["name"]: h for h in induction_results["heads"]}
    assert heads["L0H0"]["previous_token_score"] > 0.99
    assert (
        heads["L1H0"]["induction_score"] > 0.85
    )  # below 1 only where a random token repeats within a period
    for other in ("L0H1", "L1H0", "L1H1"):
        assert heads[other]["previous_token_score"] < 0.5
    for other in ("L0H0", "L0H1", "L1H1"):
        assert heads[other]["induction_score"] < 0.3
    assert heads["L1H0"]["copying_score"] == pytest.approx(1.0, abs=1e-6)
    first, second, third = induction_results["in_context_loss"]["repeats"]
    assert first > math.log(63) - 0.5 and second < 1.0 and third < 1.0


def test_a_perfect_induction_head_scores_one():
    """On a sequence with no token repeated within a period, the planted head attends exactly
    one period back, plus one: score 1.0 (TransformerLens' detect_head caps near 0.5 here)."""
    model = induction_model()
    tokens = torch.randperm(63)[:4].add(1).repeat(3)[None]  # 4 distinct tokens, three times
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    assert float(induction_scores(cache, period=4)[1, 0]) == pytest.approx(1.0, abs=1e-4)


def test_the_induction_head_k_composes_with_the_previous_token_head(induction_results):
    check = {row["head"]: row for row in induction_results["induction_check"]}
    assert check["L1H0"]["with"] == "L0H0"
    assert check["L1H0"]["k_composition_positivity"] == pytest.approx(1.0, abs=1e-6)
    assert check["L1H0"]["ov_copying"] == pytest.approx(1.0, abs=1e-6)
    k = {(e["from"], e["to"]): e for e in induction_results["composition"]["K"]}
    top = max(k.values(), key=lambda e: e["score"])
    assert (top["from"], top["to"]) == ("L0H0", "L1H0")
    assert top["score"] == pytest.approx(top["raw"] - top["baseline"])
    # the previous-token head writes where the induction head's keys read, not its queries or values
    q = {(e["from"], e["to"]): e["raw"] for e in induction_results["composition"]["Q"]}
    v = {(e["from"], e["to"]): e["raw"] for e in induction_results["composition"]["V"]}
    assert q[("L0H0", "L1H0")] < 0.01 and v[("L0H0", "L1H0")] < 0.01 and top["raw"] > 0.1


def test_ablating_the_previous_token_head_breaks_induction(induction_results):
    effects = {(e["head"], e["mode"]): e for e in induction_results["ablation"]}
    for mode in ("zero", "mean"):
        broken = effects[("L0H0", mode)]
        assert broken["induction_change"]["L1H0"] < -0.8
        assert broken["loss_change"][1] > 2.0
        harmless = effects[("L0H1", mode)]
        assert abs(harmless["induction_change"]["L1H0"]) < 0.05


def test_mean_ablation_writes_the_mean():
    model = induction_model()
    tokens = torch.randint(1, 64, (4, 12))
    _, clean = model.run_with_cache(tokens)
    _, ablated = run_ablated(model, tokens, 0, 0, "mean")
    mean = clean["blocks.0.attn.hook_result"][:, :, 0].mean((0, 1))
    torch.testing.assert_close(ablated["blocks.0.attn.hook_result"][:, :, 0], mean.expand(4, 12, -1))
    with pytest.raises(qkov.QkovError, match="'zero' or 'mean'"):
        run_ablated(model, tokens, 0, 0, "resample")


def test_term_importance_puts_induction_in_a_first_order_term(induction_results):
    """With patterns frozen, K-composition lives in L1H0's pattern: its OV reads the token
    directly, so the first-order term of L1H0 does the work and the virtual heads add nothing."""
    t = induction_results["term_importance"]
    assert t["tokens"] == "repeated random tokens"
    assert abs(t["marginal"][0]) > 1.0  # (it overshoots on the first repeat, where it cannot know)
    assert abs(t["marginal"][1]) < 0.01
    by_head = t["first_order_by_head"]
    assert by_head[1][0] == pytest.approx(t["marginal"][0], rel=0.05)
    assert abs(by_head[0][0]) < 0.01  # the previous-token head writes where W_U does not read


def test_a_pointer_arithmetic_induction_head_composes_through_its_queries():
    """Standard positions: the induction head finds its target by Q-composition with a
    duplicate-token head that writes 'earlier position + 1' (no previous-token head at all)."""
    model = pointer_arithmetic_model()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.stack([torch.randperm(31, generator=gen)[:5] + 1 for _ in range(8)]).repeat(1, 2)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    assert float(induction_scores(cache, period=5)[1, 0]) == pytest.approx(1.0, abs=1e-3)
    predicted = logits[:, 5:-1].argmax(-1)
    assert torch.equal(predicted, tokens[:, 6:])  # the second repeat is predicted exactly
    q, k = (qkov.composition_scores(model, kind, subtract_baseline=False) for kind in "QK")
    assert float(q[0, 0, 1, 0]) == pytest.approx(float(q[~q.isnan()].max()))
    assert float(q[0, 0, 1, 0]) > 0.2 and float(k[0, 0, 1, 0]) < 0.05


def test_a_virtual_two_back_head_lives_in_a_second_order_path():
    """Two previous-token heads composed through their values predict the token two back; only
    the virtual head (L0H0, L1H0) carries it, and V-composition sees the pair."""
    model = two_back_model()
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 32, (4, 12), generator=gen)
    terms = qkov.path_expansion(model, tokens)
    virtual = terms[("L0H0", "L1H0")]
    assert torch.equal(virtual[:, 2:].argmax(-1), tokens[:, :-2])
    assert float(terms[("L1H0",)].abs().max()) < 0.1 * float(virtual.abs().max())
    v = qkov.composition_scores(model, "V", subtract_baseline=False)
    assert float(v[0, 0, 1, 0]) == pytest.approx(float(v[~v.isnan()].max()))
    # "a b c a b c ...": the token after position i is the one at i - 2
    period_three = torch.stack([torch.randperm(32, generator=gen)[:3] for _ in range(4)]).repeat(1, 4)
    importance = qkov.term_importance(model, period_three)
    assert importance.marginal[1] > 1.5  # the second-order term does the predicting
    assert abs(importance.marginal[0]) < 0.5


def test_copying_and_anti_copying_heads():
    model = skip_trigram_model([(5, 3, 9)])
    copying = copying_analysis(model)
    assert copying.scores[0].tolist() == pytest.approx([0.0, 1.0, -1.0], abs=1e-9)
    assert copying.self_top1[0, 1] == 1.0 and copying.self_top1[0, 2] == 0.0
    assert copying.diagonal_z[0, 1] > 3 and copying.diagonal_z[0, 2] < -3
    assert copying.copying_heads == 1


def test_a_planted_skip_trigram_is_the_only_one_found():
    model = skip_trigram_model([(5, 3, 9)])
    trigrams = strongest_skip_trigrams(head_circuits(model, 0, 0), k=50)
    assert [(t.source, t.destination, t.out) for t in trigrams] == [(5, 3, 9)]
    t = trigrams[0]
    qk_scale = 64.0 / model.cfg.d_head**0.5
    assert t.qk == pytest.approx(qk_scale * 15 / 16) and t.ov == pytest.approx(5.0 * 15 / 16)
    assert t.strength == pytest.approx(t.qk * t.ov)
    for head in (1, 2):  # zero QK circuits: no skip-trigram at all
        assert strongest_skip_trigrams(head_circuits(model, 0, head), k=50) == []


def test_two_skip_trigrams_sharing_a_source_force_the_crossed_ones():
    model = skip_trigram_model([(5, 3, 9), (5, 4, 10)])
    circuits = head_circuits(model, 0, 0)
    trigrams = strongest_skip_trigrams(circuits, k=50)
    assert {(t.destination, t.out) for t in trigrams} == {(3, 9), (4, 10), (3, 10), (4, 9)}
    bugs = skip_trigram_bugs(circuits, trigrams)
    assert bugs
    planted = {(3, 9), (4, 10)}
    bug = next(b for b in bugs if {b.first, b.second} == planted)
    assert {(c["destination"], c["out"]) for c in bug.crossed} == {(3, 10), (4, 9)}
    corpus = np.array([5, 1, 1, 3, 9, 2, 2, 5, 4, 10, 2, 3, 10])  # "3 10" occurs, but not after a 5 nearby
    assert skip_trigram_occurs(corpus, 5, 3, 9, window=4)
    assert skip_trigram_occurs(corpus, 5, 4, 10, window=4)
    assert not skip_trigram_occurs(corpus, 5, 3, 10, window=4)
    assert skip_trigram_occurs(corpus, 5, 3, 10, window=8)
    assert not skip_trigram_occurs(corpus, 5, 4, 9, window=13)


def test_a_perfect_bigram_table_has_zero_kl_and_full_correlation():
    V = 6
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, 5000)
    counts = BigramCounts.of(tokens, V)
    table = np.zeros((V, V))
    table[counts.current, counts.next] = counts.counts
    log_p = np.log(table / table.sum(1, keepdims=True))
    cfg = qkov.Config(
        n_layers=0, n_heads=1, d_model=V, d_head=1, d_vocab=V, n_ctx=4, positional_embedding="none"
    )
    model = qkov.AttnOnlyTransformer(cfg)
    with torch.no_grad():
        model.W_E.copy_(torch.eye(V))
        model.W_U.copy_(torch.from_numpy(log_p).float())
    result = compare_bigrams(model, counts)
    assert result.kl == pytest.approx(0.0, abs=1e-6)
    assert result.correlation == pytest.approx(1.0, abs=1e-6)
    assert result.corpus_entropy == pytest.approx(math.log(V), abs=0.01)
    top = result.examples[0]
    assert [t for t, _ in top["corpus"]] == [t for t, _ in top["model"]]


def test_phase_change_is_where_the_induction_score_rises():
    scores = [(0, 0.0), (10, 0.02), (20, 0.05), (30, 0.3), (40, 0.38), (50, 0.4)]
    change = phase_change([{"tokens": t, "induction_score": s} for t, s in scores])
    assert change["onset_tokens"] == 20 and change["complete_tokens"] == 40  # 10% = 0.04, 90% = 0.36
    assert change["width_fraction"] == pytest.approx(20 / 50)
    assert change["steepest_tokens"] == 25 and change["final_induction"] == 0.4
    assert phase_change([]) is None
    assert (
        phase_change([{"tokens": 1, "induction_score": 0.3}, {"tokens": 2, "induction_score": 0.1}]) is None
    )


# -- the command ---------------------------------------------------------------------------------
def test_analyze_a_hand_written_checkpoint_without_tokenizer(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    assert not (folder / "tokenizer.json").exists()
    main(["analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [h["name"] for h in results["heads"]] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    for key in ("composition", "induction_check", "in_context_loss", "term_importance", "ablation"):
        assert key in results
    scores = {"copying_score", "previous_token_score", "induction_score", "duplicate_token_score"}
    assert set(results["heads"][0]) >= {"name", "layer", "head"} | scores
    assert results["tokens"][5] == "#5"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "K-composition" in html and "<svg" in html
    assert "L1H0" in capsys.readouterr().err


def test_analyze_a_one_layer_checkpoint_lists_skip_trigrams(tmp_path):
    qkov.save(skip_trigram_model([(5, 3, 9)]), tmp_path / "ckpt")
    main(["analyze", str(tmp_path / "ckpt"), "--quiet"])
    results = json.loads((tmp_path / "ckpt" / "analysis" / "results.json").read_text())
    top = results["skip_trigrams"]["L0H0"][0]
    assert (top["source"], top["destination"], top["out"]) == (5, 3, 9)
    assert top["source_str"] == "#5"
    assert "composition" not in results


@pytest.mark.parametrize("make", ["missing", "empty", "corrupt"])
def test_analyze_refuses_a_folder_without_a_valid_checkpoint(tmp_path, capsys, make):
    folder = tmp_path / "ckpt"
    if make != "missing":
        folder.mkdir()
    if make == "corrupt":
        qkov.save(induction_model(), folder)
        (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(folder), "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkov: error:") and len(err.splitlines()) == 1
    assert not (folder / "analysis" / "results.json").exists()


def test_analyze_with_a_corpus_needs_a_tokenizer(tmp_path, capsys, tiny_corpus):
    qkov.save(induction_model(), tmp_path / "ckpt")
    with pytest.raises(SystemExit):
        main(["analyze", str(tmp_path / "ckpt"), "--corpus", str(tiny_corpus), "--quiet"])
    assert "needs a checkpoint with a tokenizer" in capsys.readouterr().err
