"""``qkov serve``: a local web explorer of one checkpoint's heads, texts and circuits.

- :mod:`qkov.serve.explorer`: the loaded model, its token strings, and the checks every input passes;
- :mod:`qkov.serve.text`, :mod:`qkov.serve.data`, :mod:`qkov.serve.head`, :mod:`qkov.serve.pair`:
  the views, each a function calling the circuits functions ``qkov analyze`` calls;
- :mod:`qkov.serve.jobs`: answers cached in a bounded LRU, long computations as cancellable jobs;
- :mod:`qkov.serve.routes`: the endpoints, one router per view (page, text, data, head, pair, jobs);
- :mod:`qkov.serve.app`: the FastAPI app assembling them (assets, security headers, errors).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys
from pathlib import Path

from qkov.data.user_tokens import checked_user_tokens, read_user_files
from qkov.errors import QkovError
from qkov.interop import open_model as load
from qkov.serve.app import create_app
from qkov.serve.explorer import Explorer
from qkov.serve.jobs import Jobs
from qkov.sizes import check_weight_magnitudes

LOOPBACK_NAMES = ("127.0.0.1", "localhost")
REQUEST_BYTES = 64 * 2**10  # a request line with the longest text (4000 characters, percent-encoded)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(
    checkpoint: str | Path,
    host: str = "127.0.0.1",
    cache_mb: int = 256,
    workers: int = 2,
    tokens: str | Path | None = None,
    targets: str | Path | None = None,
):
    """Load ``checkpoint`` (and the user's ``tokens`` and ``targets`` files, read before it and then
    checked against it: :mod:`qkov.data.user_tokens`) once and build its app: on a loopback ``host``
    only requests naming a loopback host are served."""
    files = read_user_files(tokens, targets)  # a bad file is told before the model loads
    model = load(checkpoint)
    check_weight_magnitudes(dict(model.named_parameters()), str(checkpoint))
    data = None if files is None else checked_user_tokens(files, model.cfg)
    explorer = Explorer(model, Path(checkpoint).name, data)
    jobs = Jobs(cache_bytes=cache_mb * 2**20, workers=workers)
    allowed = list(LOOPBACK_NAMES) if host in LOOPBACK_NAMES else None
    return create_app(explorer, jobs, allowed), jobs


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one), or one line when it cannot be: the
    port taken by another program, a host that is no address of this machine."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise QkovError(f"--host {host}: not an address to listen on ({err})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        busy = (
            " (another program is using the port: choose another --port)"
            if err.errno == errno.EADDRINUSE
            else ""
        )
        raise QkovError(f"cannot listen on {host}:{port}: {err.strerror or err}{busy}") from None
    return sock


def serve(
    checkpoint: str | Path,
    host: str,
    port: int,
    cache_mb: int,
    workers: int,
    tokens: str | Path | None = None,
    targets: str | Path | None = None,
) -> None:
    """Serve until interrupted; print the URL (a warning first when others can reach it). Bad
    data is refused before the server starts."""
    import uvicorn

    if not is_loopback(host):
        print(
            f"qkov: warning: serving on {host}, reachable from other machines; the explorer has no "
            "authentication (the default --host 127.0.0.1 keeps it on this machine)",
            file=sys.stderr,
        )
    sock = listening_socket(host, port)  # before the model loads: a busy port is told at once
    try:
        app, jobs = build_app(checkpoint, host, cache_mb, workers, tokens, targets)
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        h11_max_incomplete_event_size=REQUEST_BYTES,
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    print(f"qkov serve: {Path(checkpoint)} at http://{shown}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stops cleanly on Ctrl-C, then usually re-raises it
        pass
    finally:
        jobs.shutdown()
    # also when run() returns without re-raising (seen under load): the stop was as clean
    print("qkov serve: stopped", flush=True)
