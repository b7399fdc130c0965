"""The endpoints of ``qkov serve``, one router per view: the page (its assets, the model's
description, the vocabulary search), the text view, the user's data, the head view, the pair
view, the circuit, the neuron view, and the jobs. Each endpoint checks its inputs on the explorer
(a refusal never waits for a worker) and answers through :class:`qkov.serve.jobs.Jobs`;
:func:`qkov.serve.app.create_app` assembles the routers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from qkov.circuits.skip_trigrams import check_through
from qkov.serve.circuit import check_circuit, circuit_view
from qkov.serve.data import check_page, data_rows
from qkov.serve.explorer import Explorer
from qkov.serve.head import head_scores, ov_for_token, qk_for_token, skip_trigrams
from qkov.serve.jobs import Jobs, Progress, encode
from qkov.serve.neuron import check_neuron, neuron_view
from qkov.serve.pair import (
    check_pairs_page,
    composition_scores,
    composition_tables,
    pair_view,
    strongest_view,
)
from qkov.serve.text import check_paths, path_terms, run_text, typed_targets

ASSETS = {  # the only files served: name -> media type
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
Kind = Literal["Q", "K", "V"]


def error(status: int, message: str) -> JSONResponse:
    """Every refusal's body: ``{"error": message}``."""
    return JSONResponse({"error": message}, status_code=status)


def _answerer(jobs: Jobs) -> Callable[..., Response]:
    """``answer(key, compute, quick=False)``: the cached or computed JSON (200), or the job (202)."""

    def answer(key: tuple, compute: Callable[[Progress], object], quick: bool = False) -> Response:
        status, body = jobs.answer(key, compute, quick)
        return Response(body, status_code=status, media_type="application/json")

    return answer


def page_router(ex: Explorer, assets: dict[str, bytes]) -> APIRouter:
    """The page and its assets (read once at start: no request path reaches the file system),
    and what the page reads about the model."""
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(assets["index.html"], media_type=ASSETS["index.html"])

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in assets:
            return error(404, f"no asset {name!r}")
        return Response(assets[name], media_type=ASSETS[name])

    @router.get("/api/model", summary="The checkpoint: config, head names, limits")
    def model() -> dict:
        return ex.describe()

    @router.get("/api/vocab", summary="Tokens whose string starts with a prefix (#123: token 123)")
    def vocab(prefix: str = Query(max_length=4000), k: int = 20) -> dict:
        return ex.search(prefix, k)

    return router


def text_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """A typed text: its tokens, patterns, predictions and losses (against the next token); the
    path expansion at one position."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get("/api/text", summary="Tokens, every head's pattern, prediction and loss per position")
    def text(text: str) -> Response:
        ids = ex.tokens(text)
        targets, no_loss = typed_targets(ex, ids)
        return answer(
            ("text", tuple(ids)), lambda progress: run_text(ex, ids, targets, progress) | {"no_loss": no_loss}
        )

    @router.get("/api/paths", summary="Path expansion of the logits at one position, top outputs per term")
    def paths(text: str, pos: int, k: int = 8) -> Response:
        ids, k = ex.tokens(text), ex.k(k, ex.cfg.d_out)
        check_paths(ex, ids, pos)
        targets = typed_targets(ex, ids)[0]
        key = ("paths", tuple(ids), pos, k)
        return answer(key, lambda progress: path_terms(ex, ids, targets, pos, k, progress))

    return router


def data_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """The user's own data (``--tokens``, ``--targets``): its rows, one row as a text is shown
    (against its own targets), and the path expansion at one of its positions."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get("/api/data", summary="The user's data: loss and accuracy, a page of rows with theirs")
    def data(offset: int = 0, limit: int = 50) -> Response:
        check_page(ex, offset, limit)
        return answer(("data", offset, limit), lambda progress: data_rows(ex, offset, limit, progress))

    @router.get(
        "/api/data/row", summary="One row: tokens, every head's pattern, prediction, loss per position"
    )
    def row(row: int) -> Response:
        ids, targets = ex.row(row)
        return answer(("row", row), lambda progress: run_text(ex, ids, targets, progress) | {"row": row})

    @router.get("/api/data/paths", summary="Path expansion at one position of a row, against its target")
    def paths(row: int, pos: int, k: int = 8) -> Response:
        (ids, targets), k = ex.row(row), ex.k(k, ex.cfg.d_out)
        check_paths(ex, ids, pos)
        key = ("row-paths", row, pos, k)
        return answer(key, lambda progress: path_terms(ex, ids, targets, pos, k, progress) | {"row": row})

    return router


def head_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """Every head's scores; one head's OV and QK rows and its skip-trigrams."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get("/api/heads", summary="Every head's copying, previous-token, induction, duplicate scores")
    def heads() -> Response:
        ex.require_square()
        return answer(("heads",), lambda progress: head_scores(ex, progress))

    @router.get("/api/head/{name}/ov", summary="A head's full OV circuit for a source token")
    def ov(name: str, token: int, k: int = 10) -> Response:
        (layer, head), token, k = ex.head(name), ex.token(token), ex.k(k, ex.cfg.d_out)
        return answer(
            ("ov", layer, head, token, k), lambda p: ov_for_token(ex, layer, head, token, k, p), quick=True
        )

    @router.get("/api/head/{name}/qk", summary="A head's full QK circuit for a destination token")
    def qk(name: str, token: int, k: int = 10) -> Response:
        (layer, head), token, k = ex.head(name), ex.token(token), ex.k(k)
        return answer(
            ("qk", layer, head, token, k), lambda p: qk_for_token(ex, layer, head, token, k, p), quick=True
        )

    @router.get(
        "/api/head/{name}/skip-trigrams", summary="Skip-trigrams through a source or destination token"
    )
    def trigrams(
        name: str, source: int | None = None, destination: int | None = None, k: int = 10
    ) -> Response:
        ex.require_square()
        (layer, head), k = ex.head(name), ex.k(k)
        check_through(source, destination)
        ex.token(source if source is not None else destination)
        key = ("skip-trigrams", layer, head, source, destination, k)
        return answer(key, lambda p: skip_trigrams(ex, layer, head, source, destination, k, p))

    return router


def circuit_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """The circuit graph: heads with their roles, Q/K/V edges with their attribution."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get(
        "/api/circuit", summary="The circuit graph: roles, weighted Q/K/V edges (results.json circuit)"
    )
    def circuit() -> Response:
        check_circuit(ex)
        return answer(("circuit",), lambda progress: circuit_view(ex, progress))

    return router


def pair_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """Two heads: composition, virtual-weight directions, the induction check."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get(
        "/api/pair", summary="Two heads: Q/K/V composition, virtual weight directions, induction check"
    )
    def pair(writer: str, reader: str, kind: Kind = "K", k: int = 8) -> Response:
        k = ex.k(k)
        ex.pair(writer, reader)

        def compute(progress: Progress) -> dict:
            tables = ex.once("composition", lambda: composition_tables(ex, progress))
            return pair_view(ex, tables, writer, reader, kind, k)

        return answer(("pair", writer, reader, kind, k), compute)

    @router.get("/api/pairs", summary="Pairs of heads of one kind, strongest first, by layer, paged")
    def pairs(
        kind: Kind = "K", writer_layer: int | None = None, reader_layer: int | None = None, offset: int = 0,
        limit: int = 20,
    ) -> Response:  # fmt: skip
        check_pairs_page(ex, writer_layer, reader_layer, offset, limit)

        def compute(progress: Progress) -> dict:
            scores = ex.once("composition_scores", lambda: composition_scores(ex, progress))
            return strongest_view(scores, kind, writer_layer, reader_layer, offset, limit)

        return answer(("pairs", kind, writer_layer, reader_layer, offset, limit), compute)

    return router


def neuron_router(ex: Explorer, jobs: Jobs) -> APIRouter:
    """One MLP neuron: its key and value tokens, read off the weights."""
    router, answer = APIRouter(), _answerer(jobs)

    @router.get("/api/neuron", summary="An MLP neuron: the tokens exciting it, those it raises and lowers")
    def neuron(layer: int, neuron: int, k: int = 10) -> Response:
        check_neuron(ex, layer, neuron)
        k = ex.k(k)
        key = ("neuron", layer, neuron, k)
        return answer(key, lambda p: neuron_view(ex, layer, neuron, k, p), quick=True)

    return router


def jobs_router(jobs: Jobs) -> APIRouter:
    """The long computations: their progress and answers, cancelling them, the cache's size."""
    router = APIRouter()

    @router.get("/api/stats", summary="The answer cache's size and limit; computations running")
    def stats() -> dict:
        return jobs.stats()

    @router.get("/api/jobs/{job_id}", summary="A long computation's progress; its answer once done")
    def job(job_id: str) -> Response:
        try:
            state, body = jobs.status(job_id)
        except KeyError:
            return error(404, f"no job {job_id!r} (finished jobs are forgotten after a while)")
        if state["state"] == "error":
            return error(400, state["error"])
        if state["state"] == "cancelled":
            return error(409, "the computation was cancelled")
        if body is not None:
            return Response(body, media_type="application/json")
        return Response(encode(state), status_code=202, media_type="application/json")

    @router.delete("/api/jobs/{job_id}", summary="Cancel a long computation")
    def cancel(job_id: str) -> dict:
        try:
            return jobs.cancel(job_id)
        except KeyError:
            return error(404, f"no job {job_id!r}")

    return router
