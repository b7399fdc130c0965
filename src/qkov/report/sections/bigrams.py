"""Zero layers: the direct path against the corpus' bigram statistics."""

from __future__ import annotations

from qkov.report.markup import Raw, table, tok
from qkov.results import Results


def bigram_section(r: Results) -> str:
    bigram = r.bigram
    if bigram is None:
        return ""
    strings = r.tokens

    def top(pairs: list[tuple[int, float]]) -> Raw:
        return Raw(" ".join(f"{tok(strings[token])}&nbsp;{p:.2f}" for token, p in pairs))

    rows = [[tok(strings[e.token]), e.count, top(e.corpus), top(e.model)] for e in bigram.examples]
    correlation = "undefined" if bigram.correlation is None else f"{bigram.correlation:.3f}"
    return (
        "<h3>Direct path as a bigram table</h3>"
        f"<p>Over the {bigram.tokens_compared} most common tokens: correlation of log P(next | current) "
        f"between the direct path W<sub>E</sub>W<sub>U</sub> and the corpus {correlation} "
        f"({bigram.pairs_compared} pairs); KL(corpus || model) {bigram.kl:.3f} nats against a corpus "
        f"conditional entropy of {bigram.corpus_entropy:.3f}.</p>"
        + table(["token", "count", "corpus: top next tokens", "direct path: top next tokens"], rows)
    )
