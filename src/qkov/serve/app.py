"""The web app of ``qkov serve``: JSON endpoints over one loaded checkpoint, and the page that
draws them (static assets shipped in the package, read once at start; no request path ever
reaches the file system).

Every endpoint checks its inputs against the model (400 with a one-line message, never clamped)
and answers through :class:`qkov.serve.jobs.Jobs`: cached answers at once, a computation that takes
longer than a moment as a job (202) to poll at ``/api/jobs/{id}`` and cancel with ``DELETE``.
The OpenAPI description is at ``/openapi.json``.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.head import head_scores, ov_for_token, qk_for_token, skip_trigrams
from qkov.serve.jobs import Jobs, encode
from qkov.serve.pair import composition_tables, pair_view
from qkov.serve.text import check_paths, path_terms, run_text

ASSETS = {  # the only files served: name -> media type
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# The page runs only its own script and style; nothing else loads, nothing inline runs.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
Kind = Literal["Q", "K", "V"]


def read_assets() -> dict[str, bytes]:
    folder = resources.files("qkov.serve") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(explorer: Explorer, jobs: Jobs, allowed_hosts: list[str] | None = None) -> FastAPI:
    """The app for one explorer. ``allowed_hosts`` (default: any) refuses requests naming
    another host, which stops a web page elsewhere from reaching a loopback server through DNS
    rebinding."""
    app = FastAPI(
        title="qkov serve",
        description="Explore the circuits of one attention-only transformer checkpoint.",
        docs_url=None,  # the interactive docs load scripts from a CDN; the schema is at /openapi.json
        redoc_url=None,
    )
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])
    assets = read_assets()
    ex = explorer

    @app.middleware("http")
    async def security_headers(request, call_next):
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(QkovError)
    async def bad_input(request, err: QkovError):
        return _error(400, str(err))

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:]) or "request"
        return _error(422, f"{where}: {first['msg']}")

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return _error(err.status_code, str(err.detail))

    def answer(key: tuple, compute, quick: bool = False) -> Response:
        status, body = jobs.answer(key, compute, quick)
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(assets["index.html"], media_type=ASSETS["index.html"])

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in assets:
            return _error(404, f"no asset {name!r}")
        return Response(assets[name], media_type=ASSETS[name])

    @app.get("/api/model", summary="The checkpoint: config, head names, limits")
    def model() -> dict:
        return ex.describe()

    @app.get("/api/stats", summary="The answer cache's size and limit; computations running")
    def stats() -> dict:
        return jobs.stats()

    @app.get("/api/vocab", summary="Tokens whose string starts with a prefix (#123: token 123)")
    def vocab(prefix: str = Query(max_length=4000), k: int = 20) -> dict:
        return ex.search(prefix, k)

    @app.get("/api/text", summary="Tokens, every head's attention pattern, loss per token")
    def text(text: str) -> Response:
        ids = ex.tokens(text)
        return answer(("text", tuple(ids)), lambda progress: run_text(ex, ids, progress))

    @app.get("/api/paths", summary="Path expansion of the logits at one position, top tokens per term")
    def paths(text: str, pos: int, k: int = 8) -> Response:
        ids, k = ex.tokens(text), ex.k(k)
        check_paths(ex, ids, pos)  # before queueing: a refusal never waits for a worker
        return answer(("paths", tuple(ids), pos, k), lambda progress: path_terms(ex, ids, pos, k, progress))

    @app.get("/api/heads", summary="Every head's copying, previous-token, induction, duplicate scores")
    def heads() -> Response:
        return answer(("heads",), lambda progress: head_scores(ex, progress))

    @app.get("/api/head/{name}/ov", summary="A head's full OV circuit for a source token")
    def ov(name: str, token: int, k: int = 10) -> Response:
        (layer, head), token, k = ex.head(name), ex.token(token), ex.k(k)
        return answer(
            ("ov", layer, head, token, k), lambda p: ov_for_token(ex, layer, head, token, k, p), quick=True
        )

    @app.get("/api/head/{name}/qk", summary="A head's full QK circuit for a destination token")
    def qk(name: str, token: int, k: int = 10) -> Response:
        (layer, head), token, k = ex.head(name), ex.token(token), ex.k(k)
        return answer(
            ("qk", layer, head, token, k), lambda p: qk_for_token(ex, layer, head, token, k, p), quick=True
        )

    @app.get("/api/head/{name}/skip-trigrams", summary="Skip-trigrams through a source or destination token")
    def trigrams(
        name: str, source: int | None = None, destination: int | None = None, k: int = 10
    ) -> Response:
        (layer, head), k = ex.head(name), ex.k(k)
        if (source is None) == (destination is None):
            raise QkovError("give exactly one of source and destination")
        ex.token(source if source is not None else destination)
        key = ("skip-trigrams", layer, head, source, destination, k)
        return answer(key, lambda p: skip_trigrams(ex, layer, head, source, destination, k, p))

    @app.get("/api/pair", summary="Two heads: Q/K/V composition, virtual weight directions, induction check")
    def pair(writer: str, reader: str, kind: Kind = "K", k: int = 8) -> Response:
        k = ex.k(k)
        ex.pair(writer, reader)

        def compute(progress):
            tables = ex.once("composition", lambda: composition_tables(ex, progress))
            return pair_view(ex, tables, writer, reader, kind, k)

        return answer(("pair", writer, reader, kind, k), compute)

    @app.get("/api/jobs/{job_id}", summary="A long computation's progress; its answer once done")
    def job(job_id: str) -> Response:
        try:
            state, body = jobs.status(job_id)
        except KeyError:
            return _error(404, f"no job {job_id!r} (finished jobs are forgotten after a while)")
        if state["state"] == "error":
            return _error(400, state["error"])
        if state["state"] == "cancelled":
            return _error(409, "the computation was cancelled")
        if body is not None:
            return Response(body, media_type="application/json")
        return Response(encode(state), status_code=202, media_type="application/json")

    @app.delete("/api/jobs/{job_id}", summary="Cancel a long computation")
    def cancel(job_id: str) -> dict:
        try:
            return jobs.cancel(job_id)
        except KeyError:
            return _error(404, f"no job {job_id!r}")

    return app
