"""The wheel alone: `python -m build` makes an sdist and a wheel (built from the sdist, so the sdist
is complete too); the wheel, installed into a fresh virtual environment with only torch (the same
pin as .venv) and its `serve` extra, runs from a folder outside the source tree: `qkov --version`,
`qkov reproduce --quick`, `qkov.load_results` with its shipped schema, `qkov serve` with its
shipped assets, and a TransformerLens folder import with no TransformerLens installed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import qkov
from qkov.results import SCHEMA_FILE

from conftest import random_model, write_tiny_corpus
from tl_folder import transformer_lens_folder

REPO = Path(__file__).resolve().parents[1]
TORCH = f"torch=={torch.__version__.split('+')[0]}"


def run(*args, cwd=None, timeout=900) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args[:3]}: {done.stderr[-3000:]}"
    return done.stdout


def test_the_changelog_opens_with_this_version():
    """One version string: pyproject.toml's, read back by qkov.__version__ and qkov --version."""
    headings = [line for line in (REPO / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings and headings[0].startswith(f"## {qkov.__version__} ")


def test_version_flag_prints_the_package_version(capsys):
    from qkov.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"qkov {qkov.__version__}\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(folder outside the source tree, the fresh environment's bin folder, the built files)."""
    root = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "build", "--outdir", root / "dist", REPO)
    built = sorted(p.name for p in (root / "dist").iterdir())
    wheel = root / "dist" / f"qkov-{qkov.__version__}-py3-none-any.whl"
    run(sys.executable, "-m", "venv", root / "venv")
    bin_ = root / "venv" / "bin"
    run(bin_ / "pip", "install", "-q", TORCH)
    run(bin_ / "pip", "install", "-q", f"{wheel}[serve]")
    return root, bin_, built


@pytest.mark.slow
def test_build_makes_an_sdist_and_a_wheel_of_this_version(installed):
    _, bin_, built = installed
    assert built == [f"qkov-{qkov.__version__}-py3-none-any.whl", f"qkov-{qkov.__version__}.tar.gz"]
    assert run(bin_ / "qkov", "--version") == f"qkov {qkov.__version__}\n"
    where = run(bin_ / "python", "-c", "import qkov; print(qkov.__file__)")
    assert where.startswith(str(bin_.parent)) and not where.startswith(str(REPO))
    freeze = run(bin_ / "pip", "list", "--format=freeze").lower()
    assert "transformer-lens" not in freeze and "transformer_lens" not in freeze


@pytest.fixture(scope="module")
def reproduced(installed):
    root, bin_, _ = installed
    corpus = write_tiny_corpus(root / "corpus", functions=60)
    run(bin_ / "qkov", "reproduce", "--quick", "--out", "out", "--corpus", corpus, "--quiet", cwd=root)
    return root / "out"


LOAD = """import json, sys, qkov
from qkov.results import SCHEMA_FILE
r = qkov.load_results(sys.argv[1])
print(json.dumps({"models": sorted(r.models), "claims": [c.verdict for c in r.claims], "quick": r.quick,
                  "schema": json.loads(SCHEMA_FILE.read_text())}))"""


@pytest.mark.slow
def test_reproduce_quick_and_load_results_from_the_wheel(installed, reproduced):
    root, bin_, _ = installed
    loaded = json.loads(run(bin_ / "python", "-c", LOAD, reproduced / "results.json", cwd=root))
    ours = qkov.load_results(reproduced / "results.json")  # the source tree's reading of the same file
    assert loaded["models"] == ["0-layer", "1-layer", "2-layer"] and loaded["quick"] is True
    assert loaded["claims"] == [c.verdict for c in ours.claims] and len(loaded["claims"]) == 9
    assert loaded["schema"] == json.loads(SCHEMA_FILE.read_text())
    assert "Claims:" in (reproduced / "report.html").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str, deadline: float) -> bytes:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.slow
def test_serve_from_the_wheel_serves_its_page_and_assets(installed, reproduced):
    root, bin_, _ = installed
    port = free_port()
    args = [bin_ / "qkov", "serve", reproduced / "1-layer", "--port", str(port), "--threads", "1"]
    server = subprocess.Popen([str(a) for a in args], cwd=root, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        page = fetch(f"{base}/", time.monotonic() + 120)
        script = fetch(f"{base}/static/app.js", time.monotonic() + 10)
    finally:
        server.terminate()
        server.wait(timeout=30)
    shipped = REPO / "src" / "qkov" / "serve" / "static"
    assert b"<html" in page.lower()
    assert script == (shipped / "app.js").read_bytes()


@pytest.mark.slow
def test_transformer_lens_folder_imports_from_the_wheel_without_transformer_lens(installed, tmp_path):
    root, bin_, _ = installed
    cfg = qkov.Config(n_layers=2, d_model=12, n_heads=3, d_head=4, d_vocab=23, n_ctx=9)
    model = random_model(cfg).double()
    transformer_lens_folder(tmp_path / "tl", model)
    run(bin_ / "qkov", "import", tmp_path / "tl", "--out", tmp_path / "qkov", cwd=root)
    tokens = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(1))
    ours = qkov.load(tmp_path / "qkov")(tokens).log_softmax(-1)
    torch.testing.assert_close(ours, model(tokens).log_softmax(-1), rtol=0, atol=1e-10)
    refused = subprocess.run(
        [str(bin_ / "python"), "-c", "import qkov; qkov.interop.to_hooked_transformer(None)"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "to_hooked_transformer needs TransformerLens 3.x, which is not installed" in refused.stderr
