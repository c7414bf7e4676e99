"""A small local stand-in for the Hugging Face Hub's HTTP API, for tests (there is no internet).

``HubServer`` serves model and dataset repos, each from a local directory (every file under it,
subdirectories included, ``.git`` excepted), on ``127.0.0.1`` and a free port, from a background
thread. It implements what ``huggingface_hub`` (``snapshot_download``, ``hf_hub_download``,
``HfApi``, ``HfFileSystem``), ``transformers`` (``Auto*.from_pretrained``) and ``datasets``
(``load_dataset`` of a hub repo, README ``configs:`` included) call, found by running them
against it:

- ``GET /api/{models|datasets}/{repo}[/revision/{rev}]``: the repo info (``id``, ``sha``,
  ``siblings``, ``private``, ``gated``, ``lastModified``, ``cardData`` from the README's YAML
  front matter, ``tags``);
- ``GET /api/{models|datasets}/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: the listing, in
  one page (no ``Link: rel="next"`` header);
- ``POST /api/{models|datasets}/{repo}/paths-info/{rev}`` (form or JSON ``paths``, ``expand``);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` and ``/datasets/{repo}/resolve/{rev}/{path}``
  with ``X-Repo-Commit``, ``ETag`` (the git blob sha1, as for a non-LFS file), ``Content-Length``
  and ``Range`` requests (206, or 416 past the end). No redirect, no LFS or Xet metadata.

Each repo has one commit: ``sha`` is a sha1 of the repo id and its files' contents, so it is
fixed while the files are, and the revision ``main`` or that sha resolves to it (any other:
404 ``RevisionNotFound``). ``revisions`` adds named revisions (branches or tags) of a repo,
each served from a directory of its own, with a commit of its own that resolves too. A missing
repo is 404 ``X-Error-Code: RepoNotFound`` (a repo asked for as the other kind is missing
too); a missing file 404 ``EntryNotFound``. A repo in ``gated`` answers its metadata (info,
tree, paths-info, as the hub does) but its files only to ``Authorization: Bearer <token>``;
otherwise ``X-Error-Code: GatedRepo``, which ``huggingface_hub`` raises as ``GatedRepoError``:
401 without a token, 403 with another one (as the hub answers a token whose account has not
accepted the licence). ``.requests`` counts requests per URL path (unquoted, no query), e.g.
``server.requests["/org/m/resolve/main/config.json"]``.

Responses are HTTP/1.0, one request per connection, so that no handler thread outlives a
request: ``close()`` (or leaving the ``with`` block) stops the server and joins every thread.

Pointing clients at it. ``huggingface_hub`` reads ``HF_ENDPOINT`` and ``HF_HOME`` once, at
import (``huggingface_hub.constants.ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``,
``HF_HUB_CACHE``, ...), and so does ``datasets`` (``datasets.config.HF_ENDPOINT``,
``HUB_DATASETS_URL``, ``HF_DATASETS_CACHE``, ...); setting the environment variables in a
process that has already imported them changes nothing. Hence:

- a client in a subprocess (how the product runs ``snapshot_download``/``load_dataset``): pass
  ``env=hub_env(server, home)``: ``HF_ENDPOINT``, a fresh ``HF_HOME``,
  ``HF_HUB_DISABLE_TELEMETRY=1``, no offline switches, no inherited token or cache paths;
- a client in the test process: ``use_hub(monkeypatch, server, home)`` sets the same variables
  with ``monkeypatch`` and also patches the constants above (undone at the end of the test).
  ``HF_TOKEN`` is read on every call, so ``monkeypatch.setenv("HF_TOKEN", ...)`` just works.

Only 127.0.0.1 is bound and talked to. Tests import it like tests/support.py (pytest puts
``tests/`` on ``sys.path``)::

    from hub_server import HubServer, hub_env, use_hub

    with HubServer({"org/model": model_dir, "openai/gsm8k": data_dir},
                   kinds={"openai/gsm8k": "dataset"}) as hub:
        use_hub(monkeypatch, hub, tmp_path / "hf")      # or: env=hub_env(hub, tmp_path / "hf")
        snapshot_download("org/model")
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pytest

Kind = Literal["model", "dataset"]
_LAST_MODIFIED = "2024-01-01T00:00:00.000Z"
_CHUNK = 1 << 20
# The variables that would point a client elsewhere than HF_HOME or make it offline.
_CLEARED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_DATASETS_CACHE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_XET_CACHE",
)


# openai/gsm8k's README: its configs (main, socratic) and their data files, as on the hub.
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
---
# GSM8K, as laid out on the hub
"""


class _Repo:
    """One repo: its files on disk, their git blob ids (cached by size and mtime), its commit."""

    def __init__(self, repo_id: str, root: Path, kind: Kind, gated: bool) -> None:
        self.id, self.root, self.kind, self.gated = repo_id, root, kind, gated
        self.branches: dict[str, _Repo] = {}  # named revisions besides main, each a _Repo
        self._blobs: dict[str, tuple[tuple[int, int], str]] = {}
        self._lock = threading.Lock()

    def files(self) -> dict[str, Path]:
        """Every file, by its path in the repo (posix), sorted."""
        found = {
            p.relative_to(self.root).as_posix(): p
            for p in self.root.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(self.root).parts
        }
        return dict(sorted(found.items()))

    def dirs(self) -> set[str]:
        """Every directory (that holds a file, at any depth), by its path in the repo."""
        found: set[str] = set()
        for name in self.files():
            parts = name.split("/")[:-1]
            found.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return found

    def blob_id(self, name: str) -> str:
        path = self.root / name
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._blobs.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        digest = hashlib.sha1(b"blob %d\0" % stat.st_size)
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        with self._lock:
            self._blobs[name] = (key, digest.hexdigest())
        return digest.hexdigest()

    def at(self, rev: str) -> _Repo | None:
        """The repo at revision ``rev`` (``main``, a named revision or either's commit)."""
        for repo in (self, *self.branches.values()):
            if rev == repo.commit():
                return repo
        return self if rev == "main" else self.branches.get(rev)

    def commit(self) -> str:
        digest = hashlib.sha1(f"{self.kind}:{self.id}".encode())
        for name in self.files():
            digest.update(f"\n{name}:{self.blob_id(name)}".encode())
        return digest.hexdigest()

    def entry(self, name: str, expand: bool) -> dict[str, Any]:
        """A tree / paths-info entry for a file or a directory."""
        path = self.root / name
        if path.is_file():
            entry: dict[str, Any] = {
                "type": "file",
                "oid": self.blob_id(name),
                "size": path.stat().st_size,
                "path": name,
            }
        else:
            oid = hashlib.sha1(f"tree:{self.id}:{name}".encode()).hexdigest()
            entry = {"type": "directory", "oid": oid, "size": 0, "path": name}
        if expand:
            entry["lastCommit"] = {"id": self.commit(), "title": "init", "date": _LAST_MODIFIED}
            if entry["type"] == "file":
                entry["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"status": "safe"},
                    "pickleImportScan": {"status": "unscanned"},
                }
        return entry

    def exists(self, name: str) -> bool:
        return name in self.files() or name in self.dirs()

    def info(self) -> dict[str, Any]:
        files = self.files()
        return {
            "_id": hashlib.sha1(self.id.encode()).hexdigest()[:24],
            "id": self.id,
            "author": self.id.split("/")[0] if "/" in self.id else None,
            "sha": self.commit(),
            "lastModified": _LAST_MODIFIED,
            "createdAt": _LAST_MODIFIED,
            "private": False,
            "disabled": False,
            "gated": "manual" if self.gated else False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "cardData": _card_data(files.get("README.md")),
            "siblings": [
                {"rfilename": name, "size": p.stat().st_size, "blobId": self.blob_id(name)}
                for name, p in files.items()
            ],
            "usedStorage": sum(p.stat().st_size for p in files.values()),
        }


def _card_data(readme: Path | None) -> dict[str, Any] | None:
    """The YAML front matter of a README (what the hub returns as ``cardData``), if any."""
    if readme is None:
        return None
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n", readme.read_text(encoding="utf-8"), re.S)
    if match is None:
        return None
    import yaml

    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else None


class HubServer:
    """The stand-in hub: ``repos`` maps a repo id (``org/name``) to its directory; ``kinds`` its
    kind (``"model"`` unless named ``"dataset"`` there); ``gated`` the repos whose files need
    ``Authorization: Bearer <token>``; ``revisions`` a repo's named revisions besides ``main``
    (``{"org/m": {"v2": dir}}``). Use as a context manager; ``.url`` is its endpoint."""

    def __init__(
        self,
        repos: Mapping[str, Path],
        kinds: Mapping[str, Kind] | None = None,
        token: str | None = None,
        gated: Iterable[str] = (),
        revisions: Mapping[str, Mapping[str, Path]] | None = None,
    ) -> None:
        kinds = dict(kinds or {})
        gated = set(gated)
        revisions = dict(revisions or {})
        unknown = (set(kinds) | gated | set(revisions)) - set(repos)
        if unknown:
            raise ValueError(f"kinds/gated/revisions name repos not in repos: {sorted(unknown)}")
        if gated and token is None:
            raise ValueError("a gated repo needs a token")
        self.repos = {
            rid: _Repo(rid, Path(root), kinds.get(rid, "model"), rid in gated)
            for rid, root in repos.items()
        }
        for rid, named in revisions.items():
            main = self.repos[rid]
            for rev, root in named.items():
                if rev == "main":
                    raise ValueError(f"{rid}: main is the repo's own directory")
                main.branches[rev] = _Repo(rid, Path(root), main.kind, main.gated)
        self.token = token
        self.requests: Counter[str] = Counter()
        self.log: list[tuple[str, str, int]] = []  # (method, path with query, status)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = False  # server_close() joins every handler thread
        self._httpd.hub = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server"
        )
        self._thread.start()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and join the serving thread and every request thread."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def record(self, method: str, raw_path: str, status: int) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path)
        with self._lock:
            self.requests[path] += 1
            self.log.append((method, raw_path, status))

    def find(self, kind: Kind, rest: str) -> tuple[_Repo | None, str]:
        """The repo of ``kind`` whose id starts ``rest`` (longest first) and what follows it;
        ``(None, rest)`` when none does."""
        for repo in sorted(self.repos.values(), key=lambda r: -len(r.id)):
            if repo.kind == kind and (rest == repo.id or rest.startswith(repo.id + "/")):
                return repo, rest[len(repo.id) :]
        return None, rest

    def authorized(self, repo: _Repo, header: str | None) -> bool:
        return not repo.gated or header == f"Bearer {self.token}"

    def files(self, repo_id: str, rev: str = "main") -> dict[str, Path]:
        """What ``repo_id`` serves at ``rev``, by path in the repo (for comparing downloads)."""
        repo = self.repos[repo_id].at(rev)
        if repo is None:
            raise KeyError(f"{repo_id} has no revision {rev}")
        return repo.files()


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


def _not_found(kind: Kind, rest: str) -> _HubError:
    return _HubError(404, "RepoNotFound", f"Repository not found: {kind} {rest}")


class _Handler(BaseHTTPRequestHandler):
    """Routes one request (HTTP/1.0: the connection closes after it)."""

    server_version = "streamrl-test-hub/1"
    timeout = 30  # a stalled client cannot hold a handler thread (and close()) for long

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass  # requests are counted in .requests / .log, not printed

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        status = 500
        try:
            if url.path.startswith(("/api/models/", "/api/datasets/")):
                status = self._api(method, url.path, query)
            elif "/resolve/" in url.path and method in ("GET", "HEAD"):
                status = self._resolve(method, url.path)
            else:
                raise _HubError(404, None, f"no such endpoint: {method} {url.path}")
        except _HubError as e:
            status = self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            status = 499  # the client went away mid-response
        finally:
            self.hub.record(method, self.path, status)

    # ------------------------------------------------------------------------- API endpoints

    def _api(self, method: str, path: str, query: dict[str, list[str]]) -> int:
        kind: Kind = "model" if path.startswith("/api/models/") else "dataset"
        rest = path.split("/", 3)[3]
        repo, tail = self.hub.find(kind, rest)
        if repo is None:
            raise _not_found(kind, rest)
        parts = tail.split("/")  # "", then the endpoint, the revision, a path (all %-encoded)
        endpoint = parts[1] if len(parts) > 1 else ""
        rev = urllib.parse.unquote(parts[2]) if len(parts) > 2 else "main"
        sub = urllib.parse.unquote("/".join(parts[3:])).strip("/")
        expand = _flag(query.get("expand", ["false"])[0])
        if method == "GET" and endpoint in ("", "revision"):
            repo = self._check_revision(repo, rev)
            return self._json(200, repo.info(), repo)
        if method == "GET" and endpoint == "tree":
            repo = self._check_revision(repo, rev)
            recursive = _flag(query.get("recursive", ["false"])[0])
            return self._json(200, self._tree(repo, sub, recursive, expand), repo)
        if method == "POST" and endpoint == "paths-info":
            repo = self._check_revision(repo, rev)
            paths, expand = self._paths_info_body()
            found = [repo.entry(p.strip("/"), expand) for p in paths if repo.exists(p.strip("/"))]
            return self._json(200, found, repo)
        raise _HubError(404, None, f"no such endpoint: {method} {path}")

    def _tree(self, repo: _Repo, sub: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
        if sub and sub not in repo.dirs():
            raise _HubError(404, "EntryNotFound", f"{sub} is not a directory", repo.commit())
        prefix = f"{sub}/" if sub else ""
        names = [n for n in [*repo.dirs(), *repo.files()] if n.startswith(prefix)]
        if not recursive:
            names = [n for n in names if "/" not in n[len(prefix) :]]
        return [repo.entry(n, expand) for n in sorted(names)]

    def _paths_info_body(self) -> tuple[list[str], bool]:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            data = json.loads(body or "{}")
            return list(data.get("paths", [])), _flag(str(data.get("expand", False)))
        form = urllib.parse.parse_qs(body)
        return form.get("paths", []), _flag(form.get("expand", ["false"])[0])

    # ------------------------------------------------------------------------- file downloads

    def _resolve(self, method: str, path: str) -> int:
        kind: Kind = "dataset" if path.startswith("/datasets/") else "model"
        rest = path[len("/datasets/") :] if kind == "dataset" else path[1:]
        repo, tail = self.hub.find(kind, rest)
        if repo is None or not tail.startswith("/resolve/"):
            raise _not_found(kind, rest.split("/resolve/")[0])
        rev, _, name = tail[len("/resolve/") :].partition("/")
        repo = self._check_revision(repo, urllib.parse.unquote(rev))
        auth = self.headers.get("Authorization")
        if not self.hub.authorized(repo, auth):
            status = 401 if auth is None else 403  # no token; a token without access
            raise _HubError(status, "GatedRepo", f"Access to {repo.id} is restricted.")
        name = urllib.parse.unquote(name)
        file = repo.files().get(name)
        if file is None:
            raise _HubError(404, "EntryNotFound", f"{name} not found in {repo.id}", repo.commit())
        return self._send_file(method, repo, name, file)

    def _send_file(self, method: str, repo: _Repo, name: str, file: Path) -> int:
        size = file.stat().st_size
        start, end = 0, size - 1
        status = 200
        wanted = _parse_range(self.headers.get("Range"), size)
        if wanted == "unsatisfiable":
            self._start(416, repo, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
            return 416
        if wanted is not None:
            (start, end), status = wanted, 206
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start + 1),
            "ETag": f'"{repo.blob_id(name)}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{Path(name).name}"',
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self._start(status, repo, headers)
        if method == "GET":
            with file.open("rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0 and (chunk := f.read(min(_CHUNK, left))):
                    self.wfile.write(chunk)
                    left -= len(chunk)
        return status

    # ------------------------------------------------------------------------- helpers

    def _check_revision(self, repo: _Repo, rev: str) -> _Repo:
        """The repo at ``rev``, or 404 ``RevisionNotFound``."""
        found = repo.at(rev)
        if found is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return found

    def _start(self, status: int, repo: _Repo | None, headers: dict[str, str]) -> None:
        self.send_response(status)
        if repo is not None:
            self.send_header("X-Repo-Commit", repo.commit())
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _json(self, status: int, obj: Any, repo: _Repo | None) -> int:
        body = json.dumps(obj).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        self._start(status, repo, headers)
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def _error(self, e: _HubError) -> int:
        body = json.dumps({"error": e.message}).encode()
        self.send_response(e.status)
        if e.code is not None:
            self.send_header("X-Error-Code", e.code)
        self.send_header("X-Error-Message", e.message)
        if e.commit is not None:
            self.send_header("X-Repo-Commit", e.commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return e.status


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``(start, end)`` (inclusive) of a single ``bytes=`` range, ``"unsatisfiable"``, or None
    for no (or an unparsed) range: then the whole file is sent."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header or "")
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return "unsatisfiable"
    return start, end


# ----------------------------------------------------------------------------- pointing clients


def hub_env(
    server: HubServer, home: Path, token: str | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a client subprocess (``subprocess.run(..., env=hub_env(...))``):
    ``base`` (default ``os.environ``) with ``HF_ENDPOINT`` set to ``server``, ``HF_HOME`` to
    ``home`` (a fresh directory: every HF cache lives under it), telemetry off, the offline
    switches and inherited cache paths and tokens removed, and ``HF_TOKEN`` if ``token``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for key in _CLEARED_ENV:
        env.pop(key, None)
    env.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def use_hub(monkeypatch: pytest.MonkeyPatch, server: HubServer, home: Path) -> None:
    """Point ``huggingface_hub``, ``transformers`` and ``datasets`` in this process at ``server``
    with ``home`` as ``HF_HOME``: the variables of ``hub_env`` (set with ``monkeypatch``) and
    the module constants the libraries computed from them at import."""
    for key in _CLEARED_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in hub_env(server, home, base={}).items():
        monkeypatch.setenv(key, value)
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst
    import transformers.utils.hub as thub

    hub_cache = str(home / "hub")
    for name, value in {
        "ENDPOINT": server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": hub_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "HF_XET_CACHE": str(home / "xet"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HUGGINGFACE_ASSETS_CACHE": str(home / "assets"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }.items():
        if hasattr(hconst, name):
            monkeypatch.setattr(hconst, name, value)
    datasets_cache = home / "datasets"
    for name, value in {
        "HF_ENDPOINT": server.url,
        "HUB_DATASETS_URL": server.url + "/datasets/{repo_id}/resolve/{revision}/{path}",
        "HF_CACHE_HOME": str(home),
        "HF_DATASETS_CACHE": datasets_cache,
        "DOWNLOADED_DATASETS_PATH": datasets_cache / "downloads",
        "EXTRACTED_DATASETS_PATH": datasets_cache / "downloads" / "extracted",
        "HF_MODULES_CACHE": home / "modules",
        "HF_HUB_OFFLINE": False,
        "HF_DATASETS_OFFLINE": False,
    }.items():
        if hasattr(dconfig, name):
            monkeypatch.setattr(dconfig, name, value)
    for name, value in {"HF_MODULES_CACHE": str(home / "modules")}.items():
        if hasattr(thub, name):
            monkeypatch.setattr(thub, name, value)
