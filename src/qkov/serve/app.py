"""The web app of ``qkov serve``: JSON endpoints over one loaded checkpoint, and the page that
draws them (static assets shipped in the package, read once at start; no request path ever
reaches the file system). The endpoints are in :mod:`qkov.serve.routes`, one router per view;
here they are assembled behind the security headers, the host check and the error handlers.

Every endpoint checks its inputs against the model (400 with a one-line message, never clamped)
and answers through :class:`qkov.serve.jobs.Jobs`: cached answers at once, a computation that takes
longer than a moment as a job (202) to poll at ``/api/jobs/{id}`` and cancel with ``DELETE``.
The OpenAPI description is at ``/openapi.json``.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from qkov.errors import QkovError
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Jobs
from qkov.serve.routes import (
    ASSETS,
    circuit_router,
    data_router,
    error,
    head_router,
    jobs_router,
    neuron_router,
    page_router,
    pair_router,
    text_router,
)

# The page runs only its own script and style; nothing else loads, nothing inline runs.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def read_assets() -> dict[str, bytes]:
    folder = resources.files("qkov.serve") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


def _guard(app: FastAPI, allowed_hosts: list[str] | None) -> None:
    """The host check, the security headers on every response, and every error as one line of JSON."""
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])

    @app.middleware("http")
    async def security_headers(request, call_next):
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(QkovError)
    async def bad_input(request, err: QkovError):
        return error(400, str(err))

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:]) or "request"
        return error(422, f"{where}: {first['msg']}")

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return error(err.status_code, str(err.detail))

    @app.exception_handler(Exception)
    async def server_error(request, err: Exception):
        """A bug in qkov, not bad input: still one line of JSON with the headers (this response
        bypasses the middleware above); the traceback goes to the server's log."""
        response = error(500, f"internal error ({type(err).__name__}); see the server's log")
        response.headers.update(SECURITY_HEADERS)
        return response


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
    _guard(app, allowed_hosts)
    for router in (
        page_router(explorer, read_assets()),
        text_router(explorer, jobs),
        data_router(explorer, jobs),
        head_router(explorer, jobs),
        pair_router(explorer, jobs),
        circuit_router(explorer, jobs),
        neuron_router(explorer, jobs),
        jobs_router(jobs),
    ):
        app.include_router(router)
    return app
