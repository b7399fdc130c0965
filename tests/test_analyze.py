"""The registered steps and `qkov analyze`: every analysis finds exactly what the hand-built models
plant, the registry is consistent, and the command writes its files or says in one line why not."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import qkov
from qkov import context
from qkov.analyze import STEP_NAMES, STEPS, TOKENS, analyze, check_selection, run_steps
from qkov.circuits import copying
from qkov.cli import main
from qkov.data.tokens import TokenSplits
from qkov.model import Block, Transformer
from qkov.report.sections import SECTIONS
from qkov.results import Results

from conftest import random_model
from handbuilt import induction_model, skip_trigram_model


@pytest.fixture(scope="module")
def induction_results() -> Results:
    torch.manual_seed(0)
    return analyze(induction_model(), show_progress=False)


def test_the_previous_token_head_and_the_induction_head_are_found(induction_results):
    t = induction_results.repeated_tokens
    heads = {h.name: h for h in t.heads}
    assert heads["L0H0"].previous_token_score > 0.99
    assert heads["L1H0"].induction_score > 0.85  # below 1 only where a random token repeats within a period
    assert t.previous_token_heads == ["L0H0"] and t.induction_heads == ["L1H0"]
    for other in ("L0H1", "L1H0", "L1H1"):
        assert heads[other].previous_token_score < 0.5
    for other in ("L0H0", "L0H1", "L1H1"):
        assert heads[other].induction_score < 0.3
    copying = {h.name: h for h in induction_results.copying.heads}
    assert copying["L1H0"].copying_score == pytest.approx(1.0, abs=1e-6)
    first, second, third = t.loss_per_repeat
    assert first > math.log(63) - 0.5 and second < 1.0 and third < 1.0


def test_the_induction_head_k_composes_with_the_previous_token_head(induction_results):
    check = {row.head: row for row in induction_results.induction_check}
    assert check["L1H0"].writer == "L0H0"
    assert check["L1H0"].k_composition_positivity == pytest.approx(1.0, abs=1e-6)
    assert check["L1H0"].ov_copying == pytest.approx(1.0, abs=1e-6)
    c = induction_results.composition
    top = max(c.K, key=lambda p: p.score)
    assert (top.writer, top.reader) == ("L0H0", "L1H0")
    assert top.score == pytest.approx(top.raw - c.baseline)
    # the previous-token head writes where the induction head's keys read, not its queries or values
    q = {(p.writer, p.reader): p.raw for p in c.Q}
    v = {(p.writer, p.reader): p.raw for p in c.V}
    assert q[("L0H0", "L1H0")] < 0.01 and v[("L0H0", "L1H0")] < 0.01 and top.raw > 0.1


def test_term_importance_puts_induction_in_a_first_order_term(induction_results):
    """With patterns frozen, K-composition lives in L1H0's pattern: its OV reads the token
    directly, so the first-order term of L1H0 does the work and the virtual heads add nothing."""
    t = induction_results.term_importance
    assert t.tokens == "repeated random tokens"
    assert abs(t.marginal[0]) > 1.0  # (it overshoots on the first repeat, where it cannot know)
    assert abs(t.marginal[1]) < 0.01
    assert t.first_order_by_head[1][0] == pytest.approx(t.marginal[0], rel=0.05)
    assert abs(t.first_order_by_head[0][0]) < 0.01  # the previous-token head writes where W_U does not read


def test_the_eigenvalues_and_the_direct_measures_both_say_the_induction_head_copies(induction_results):
    r = induction_results
    assert (
        [s.name for s in r.spectra.OV]
        == [d.name for d in r.copying_direct]
        == [c.name for c in r.copying.heads]
    )
    induction = next(c for c in r.copying_comparison if c.name == "L1H0")
    assert induction.eigenvalues_say_copying and induction.direct_says_copying and not induction.disagree
    direct = next(d for d in r.copying_direct if d.name == "L1H0")
    assert direct.exact and direct.self_top1 == 1.0  # the head's OV circuit is the identity on tokens
    assert len(r.spectra.QK) == 4


def test_captions_come_from_the_data(induction_results):
    example = induction_results.attention_examples.repeated
    assert example.description == "repeated random tokens (4 tokens, 3 times)"  # n_ctx 12
    assert len(example.tokens) == 12


# -- the registry ------------------------------------------------------------------------------------
def test_every_step_fills_a_results_field_with_a_report_section():
    fields = set(Results.__dataclass_fields__)
    names = [s.name for s in STEPS]
    assert len(names) == len(set(names)) and set(names) <= fields
    assert set(names) <= set(SECTIONS)


def test_a_step_reads_only_steps_before_it():
    seen: set[str] = set()
    for step in STEPS:
        assert set(step.reads) <= seen, (step.name, step.reads)
        seen.add(step.name)


@pytest.mark.parametrize("with_corpus", [False, True], ids=["no corpus", "corpus"])
@pytest.mark.parametrize("n_layers", [0, 1, 2])
def test_analyze_fills_the_fields_of_exactly_the_steps_that_apply(n_layers, with_corpus):
    cfg = qkov.Config(n_layers=n_layers, n_heads=2, d_model=16, d_head=4, d_vocab=24, n_ctx=12)
    rng = np.random.default_rng(0)
    corpus = TokenSplits(rng.integers(0, 24, 3000), rng.integers(0, 24, 600)) if with_corpus else None
    results = analyze(random_model(cfg), corpus, show_progress=False)
    filled = {s.name for s in STEPS if getattr(results, s.name) is not None}
    assert filled == {s.name for s in STEPS if s.skip_reason(cfg, with_corpus) is None}
    assert set(results.skipped) == {s.name for s in STEPS} - filled
    assert ("composition" in filled) == (n_layers >= 2) and ("skip_trigrams" in filled) == (n_layers == 1)
    assert ("bigram" in filled) == with_corpus


# -- the command ---------------------------------------------------------------------------------
def test_analyze_a_hand_written_checkpoint_without_tokenizer(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    assert not (folder / "tokenizer.json").exists()
    main(["analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
    results = qkov.load_results(tmp_path / "out" / "results.json")
    assert [h.name for h in results.repeated_tokens.heads] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert all(x is not None for x in (results.composition, results.induction_check, results.ablation))
    assert results.bigram is None and results.tokens[5] == "#5"
    raw = json.loads((tmp_path / "out" / "results.json").read_text())
    assert raw["schema_version"] == 4
    html = (tmp_path / "out" / "report.html").read_text()
    for kind in "QKV":  # the composition figure: each kind's two heatmaps, with every pair's cell
        for title in ("baseline subtracted", "raw"):
            assert html.count(f'aria-label="{kind}-composition {title}"') == 1
    assert html.count("<title>L0H0 → L1H0: ") == 6 and html.count("<title>L0H1 → L1H1: ") == 6
    assert "L1H0" in capsys.readouterr().err


def test_analyze_a_one_layer_checkpoint_lists_skip_trigrams(tmp_path):
    qkov.save(skip_trigram_model([(5, 3, 9)]), tmp_path / "ckpt")
    main(["analyze", str(tmp_path / "ckpt"), "--quiet"])
    results = qkov.load_results(tmp_path / "ckpt" / "analysis" / "results.json")
    top = results.skip_trigrams.tables["L0H0"][0]
    assert (top.source, top.destination, top.out) == (5, 3, 9)
    assert results.tokens[top.source] == "#5"
    assert results.composition is None


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


def _steps_for(model, corpus) -> list[str]:
    return [s.name for s in STEPS if s.skip_reason(model.cfg, corpus is not None) is None]


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut to the budgets"])
@pytest.mark.parametrize("kind", ["hand-built induction", "LayerNorm, MLP, biases", "one layer"])
def test_no_step_makes_a_tensor_without_saying_where(monkeypatch, kind, cut):
    """``qkov analyze --device cuda`` computes on the GPU only if no step makes a tensor without a
    device: such a tensor lands on the default device (the CPU) and meets the model's. This machine
    has no GPU, so the test makes the default device ``meta`` (tensors without data): a tensor made
    without a device then fails, or changes a number, and the results differ from a plain run.
    ``cut``: the budgets shrunk so that every batch is cut, a shorter period drawn and the direct
    copying measures sampled, so those paths are covered too."""
    if cut:
        monkeypatch.setattr(context, "RERUN_FLOP_BUDGET", 2e5)
        monkeypatch.setattr(copying, "EXACT_FLOP_BUDGET", {"cpu": 1e4, "cuda": 1e4})
        monkeypatch.setattr(copying, "MIN_DIAGONAL_ROWS", 4)
    gen = np.random.default_rng(0)
    if kind == "hand-built induction":
        model = induction_model()
    elif kind == "one layer":
        model = skip_trigram_model([(3, 4, 5)])
    else:
        cfg = qkov.Config(2, 3, 12, 4, 40, 24, normalization="LN", d_mlp=16, act_fn="gelu_new")
        model = random_model(cfg, biases=True)
    d_vocab = model.cfg.d_vocab
    corpus = TokenSplits(gen.integers(0, d_vocab, 4000), gen.integers(0, d_vocab, 1000))
    expected = run_steps(model, _steps_for(model, corpus), corpus)
    with torch.device("meta"):
        got = run_steps(model, _steps_for(model, corpus), corpus)
    assert got == expected
    if cut:
        assert not got["copying_direct"][0].exact and got["copying_direct"][0].diagonal_rows == 4
        assert "(" in got["term_importance"].tokens  # cut, and says so


# -- choosing what runs: --weights-only and --steps ---------------------------------------------------
LLAMA_LIKE = qkov.Config(
    2, 4, 16, 4, 30, 24, positional_embedding="rotary", n_key_value_heads=2, normalization="RMS", d_mlp=8,
    act_fn="silu", gated_mlp=True,
)  # fmt: skip
WEIGHTS_ONLY_CASES = {
    "LayerNorm, MLP, biases": lambda: random_model(
        qkov.Config(2, 3, 12, 4, 40, 24, normalization="LN", d_mlp=16, act_fn="gelu_new"), biases=True
    ),
    "one layer": lambda: skip_trigram_model([(3, 4, 5)]),
    "rotary, grouped-query, gated RMSNorm MLP": lambda: random_model(LLAMA_LIKE),
}


def refuse_forward_passes(monkeypatch) -> list[str]:
    """Every way into the model's forward (token checks, the embedding, a block) fails, and is
    counted; returns the count."""
    calls: list[str] = []

    def refuse(name):
        def refused(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"a forward pass ({name})")

        return refused

    for owner, name in ((Transformer, "check_tokens"), (Transformer, "embed"), (Block, "forward")):
        monkeypatch.setattr(owner, name, refuse(f"{owner.__name__}.{name}"))
    return calls


def test_a_step_that_needs_no_tokens_reads_only_steps_that_need_none():
    inputs = {s.name: s.inputs for s in STEPS}
    for step in STEPS:
        if step.inputs != TOKENS:
            assert all(inputs[name] != TOKENS for name in step.reads), step.name


@pytest.mark.parametrize("kind", WEIGHTS_ONLY_CASES)
def test_weights_only_runs_no_forward_pass(monkeypatch, kind):
    model = WEIGHTS_ONLY_CASES[kind]()
    calls = refuse_forward_passes(monkeypatch)
    with pytest.raises(AssertionError, match="a forward pass"):  # the patch does catch a full analysis
        analyze(model, show_progress=False)
    assert calls
    calls.clear()
    results = analyze(model, show_progress=False, weights_only=True)
    assert calls == []
    cfg = model.cfg
    alone = [s.name for s in STEPS if s.inputs != TOKENS and s.skip_reason(cfg, False) is None]
    assert results.steps.ran == alone and results.steps.added == {}
    assert results.steps.chosen == "the steps that read the weights alone (--weights-only)"
    filled = [s.name for s in STEPS if getattr(results, s.name) is not None]
    assert set(filled) <= set(alone) and set(alone) - set(filled) <= {"qk_position_content"}  # no positions
    for step in STEPS:
        if step.inputs == TOKENS:
            assert getattr(results, step.name) is None
            assert results.skipped[step.name] in (
                "reads tokens, not the weights alone (--weights-only)",
                step.skip_reason(cfg, False),
            )
    assert {"spectra", "copying", "qk_position_content"} <= set(alone)
    if cfg.has_mlp:
        assert "neurons" in alone and results.neurons.data is None  # ranked on the weights
    if cfg.n_layers == 1:
        assert "skip_trigrams" in alone and results.skip_trigrams.bug_cost is None


def test_weights_only_gives_the_numbers_of_a_full_analysis():
    model = WEIGHTS_ONLY_CASES["LayerNorm, MLP, biases"]()
    whole = analyze(model, show_progress=False)
    alone = analyze(model, show_progress=False, weights_only=True)
    for name in alone.steps.ran:
        if name != "neurons":  # ranked on the next tokens in a full analysis, on the weights here
            assert getattr(alone, name) == getattr(whole, name), name


def test_steps_runs_the_named_ones_and_what_they_read(induction_results):
    model = induction_model()
    results = analyze(model, show_progress=False, steps=["induction_check", "spectra"])
    assert results.steps.ran == ["spectra", "copying", "induction_check"]
    assert results.steps.added == {"copying": "read by induction_check"}
    assert results.steps.chosen == "the steps named (--steps induction_check,spectra)"
    assert results.induction_check == induction_results.induction_check
    assert results.spectra == induction_results.spectra
    assert results.repeated_tokens is None and results.skipped["repeated_tokens"] == "not among --steps"
    assert set(results.skipped) == set(STEP_NAMES) - set(results.steps.ran)


def test_a_named_step_that_does_not_apply_is_skipped_with_its_reason():
    results = analyze(skip_trigram_model([(3, 4, 5)]), show_progress=False, steps=["composition", "spectra"])
    assert results.steps.ran == ["spectra"]
    assert results.skipped["composition"] == "needs at least 2 layer(s)"


@pytest.mark.parametrize(
    "names, weights_only, given, message",
    [
        (["spectra", "nonsense"], False, {}, "--steps: no step nonsense (the steps: bigram, spectra,"),
        ([], False, {}, "--steps: name at least one step"),
        (["circuit"], True, {}, "--steps circuit: runs the model on tokens, which --weights-only leaves out"),
        (None, True, {"has_corpus": True}, "--weights-only reads no tokens: leave out --corpus"),
    ],
)
def test_a_choice_that_cannot_run_is_refused(names, weights_only, given, message):
    with pytest.raises(qkov.QkovError) as err:
        check_selection(names, weights_only, **given)
    assert str(err.value).startswith(message)
    model, rng = induction_model(), np.random.default_rng(0)
    d_vocab = model.cfg.d_vocab
    corpus = TokenSplits(rng.integers(0, d_vocab, 300), rng.integers(0, d_vocab, 60)) if given else None
    with pytest.raises(qkov.QkovError, match=message.split(" (")[0]):
        analyze(model, corpus, show_progress=False, steps=names, weights_only=weights_only)


def test_analyze_weights_only_and_steps_from_the_command_line(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    calls = refuse_forward_passes(monkeypatch)
    main(["analyze", str(folder), "--out", str(tmp_path / "w"), "--quiet", "--weights-only"])
    assert calls == []
    raw = json.loads((tmp_path / "w" / "results.json").read_text())
    assert raw["steps"]["ran"] == ["spectra", "copying_direct", "copying", "copying_comparison"] + [
        "qk_position_content", "composition", "induction_check"
    ]  # fmt: skip
    assert raw["repeated_tokens"] is None
    assert raw["skipped"]["ablation"] == "reads tokens, not the weights alone (--weights-only)"
    html = (tmp_path / "w" / "report.html").read_text()
    assert "Analyses run" in html and "Analyses not run" in html
    assert "ran spectra, copying_direct" in capsys.readouterr().err
    monkeypatch.undo()
    main(["analyze", str(folder), "--out", str(tmp_path / "s"), "--quiet", "--steps", "circuit"])
    steps = qkov.load_results(tmp_path / "s" / "results.json").steps
    assert steps.ran == ["copying", "repeated_tokens", "correction", "circuit"]
    assert steps.added["repeated_tokens"] == "read by correction, circuit"
    assert "also ran repeated_tokens: read by correction, circuit" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "spectra,nope"], "--steps: no step nope (the steps: "),
        (["--steps", ","], "--steps: name at least one step"),
        (["--weights-only", "--steps", "ablation"], "--steps ablation: runs the model on tokens"),
        (["--weights-only", "--tokens", "t.npy"], "--weights-only reads no tokens: leave out --tokens"),
    ],
)
def test_the_command_refuses_a_bad_choice_before_reading_the_model(tmp_path, capsys, argv, message):
    """The checkpoint does not exist: the choice is refused first, in one line."""
    with pytest.raises(SystemExit) as stop:
        main(["analyze", str(tmp_path / "missing"), "--quiet", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"qkov: error: {message}") and len(err.splitlines()) == 1
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    "files, message",
    [
        (["--tokens", "missing.npy"], "missing.npy: no such file"),
        (["--tokens", "t.npy", "--targets", "missing.pt"], "missing.pt: no such file"),
        (["--tokens", "t.npy", "--targets", "float.npy"], "float.npy: token ids must be integers, got dtype"),
    ],
)
def test_a_bad_tokens_file_is_told_before_the_model_opens(tmp_path, capsys, monkeypatch, files, message):
    folder = tmp_path / "ckpt"
    qkov.save(induction_model(), folder)
    np.save(tmp_path / "t.npy", np.zeros((2, 4), dtype=np.int64))
    np.save(tmp_path / "float.npy", np.zeros((2, 4)))

    def opened(*args, **kwargs):
        raise AssertionError("the model was opened before the files were read")

    monkeypatch.setattr(qkov.interop, "open_model", opened)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["analyze", str(folder), "--out", str(tmp_path / "out"), "--quiet", *files])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"qkov: error: {message}") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
