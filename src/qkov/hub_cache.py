"""A model by its Hugging Face name (``org/name``, or ``org/name@revision``), read from the local
Hugging Face cache, offline: qkov never downloads and never touches the network.

The cache is laid out as ``huggingface_hub`` writes it: the folder is ``HF_HUB_CACHE`` (or its older
name ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
else ``~/.cache/huggingface/hub``; a model lives in ``models--org--name/``, whose
``refs/<revision>`` (``main`` when none is given) holds a commit hash, and whose
``snapshots/<hash>/`` holds the files (``config.json``, the safetensors), each a link into
``blobs/``. A revision that names no ref is read as a commit hash (``snapshots/<revision>``).

:func:`resolve_source` is what every command's source goes through: an existing path is that path
(a folder named like a model wins over the cache), a name is its snapshot folder, and anything else
is left for the caller's own one-line error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from qkov.errors import QkovError

# huggingface_hub's repository ids: letters, digits, '_', '-' and '.', no '--' or '..'
_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_REVISION = r"[A-Za-z0-9_.][A-Za-z0-9_./-]*"  # a branch, a tag or a commit hash
HUB_NAME = re.compile(rf"(?P<org>{_PART})/(?P<name>{_PART})(?:@(?P<revision>{_REVISION}))?")
NEVER_DOWNLOADS = "qkov never downloads: fetch it first (huggingface-cli download {repo}) or give a folder"


@dataclass(frozen=True)
class HubName:
    """``org/name`` and the revision asked for (None: ``main``)."""

    org: str
    name: str
    revision: str | None

    @property
    def repo(self) -> str:
        return f"{self.org}/{self.name}"

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")


def hub_name(source: str | os.PathLike) -> HubName | None:
    """``source`` read as a Hugging Face model name, or None when it does not look like one."""
    match = HUB_NAME.fullmatch(os.fspath(source))
    if match is None:
        return None
    org, name, revision = match.group("org", "name", "revision")
    parts = (org, name, *(revision.split("/") if revision else ()))
    if any("--" in p or ".." in p for p in (org, name)) or any(p in ("", ".", "..") for p in parts):
        return None
    return HubName(org, name, revision)


def hub_cache_folder() -> tuple[Path, str]:
    """The Hugging Face cache folder, as ``huggingface_hub`` finds it, and the setting that chose it
    (to say where qkov looked)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return _expanded(os.environ[variable]), variable
    if os.environ.get("HF_HOME"):
        return _expanded(os.environ["HF_HOME"]) / "hub", "HF_HOME/hub"
    if os.environ.get("XDG_CACHE_HOME"):
        where = "XDG_CACHE_HOME/huggingface/hub"
        return _expanded(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub", where
    return _expanded("~/.cache/huggingface/hub"), "the default: neither HF_HUB_CACHE nor HF_HOME is set"


def _expanded(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def resolve_source(source: str | os.PathLike) -> Path:
    """The folder or file ``source`` names: itself when it exists; the cached snapshot folder when it
    is a Hugging Face name (:func:`cached_snapshot`); else the path as given, for the caller to say
    that it is missing."""
    path = Path(source)
    if path.exists() or path.is_symlink():
        return path
    name = hub_name(source)
    return path if name is None else cached_snapshot(name, path)


def cached_snapshot(name: HubName, local: Path | None = None) -> Path:
    """The snapshot folder of ``name`` in the cache, every file in it a link that leads to a file;
    one line otherwise, naming every place looked at (``local`` too, the path that was not there)."""
    cache, chosen = hub_cache_folder()
    model = cache / f"models--{name.org}--{name.name}"
    here = f"no folder {local.absolute()}, and " if local is not None else ""
    if not model.is_dir():
        raise QkovError(
            f"{name}: {here}not in the Hugging Face cache (looked for {model}; cache from {chosen}); "
            + NEVER_DOWNLOADS.format(repo=name.repo)
        )
    revision = name.revision or "main"
    ref = model / "refs" / revision
    if ref.is_file():
        try:
            commit = ref.read_text(encoding="utf-8", errors="replace").strip()
        except OSError as err:
            raise QkovError(f"{name}: cannot read {ref} ({err.strerror or err})") from None
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", commit) or commit in (".", ".."):
            raise QkovError(f"{name}: {ref} holds no commit hash ({commit[:60]!r})")
        snapshot = model / "snapshots" / commit
        if not snapshot.is_dir():
            raise QkovError(
                f"{name}: {ref} names commit {commit}, but {snapshot} is missing (a download cut short?); "
                + NEVER_DOWNLOADS.format(repo=name.repo)
            )
        return _checked_links(name, snapshot)
    snapshot = model / "snapshots" / revision
    if snapshot.is_dir():
        return _checked_links(name, snapshot)
    refs = sorted(p.name for p in (model / "refs").glob("*") if p.is_file())
    raise QkovError(
        f"{name}: no revision {revision} in the Hugging Face cache (looked for {ref} and {snapshot}; "
        f"refs cached: {', '.join(refs) or 'none'}); " + NEVER_DOWNLOADS.format(repo=name.repo)
    )


def _checked_links(name: HubName, snapshot: Path) -> Path:
    """``snapshot``, once every file in it leads somewhere (a link to a missing blob would otherwise
    read as a file that is not there)."""
    for file in sorted(snapshot.iterdir()):
        if file.is_symlink() and not file.exists():
            raise QkovError(
                f"{name}: {file} is a link to a missing blob ({os.readlink(file)}; a download cut short?); "
                + NEVER_DOWNLOADS.format(repo=name.repo)
            )
    return snapshot
