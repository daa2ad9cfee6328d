"""A local stand-in for the Hugging Face Hub, just big enough for huggingface_hub's own client.

It implements the routes that ``HfApi.create_repo``, ``create_branch``, ``delete_branch``, ``upload_folder`` /
``create_commit`` (with every file sent inline as a "regular" blob, and file deletions), ``list_repo_tree``,
``model_info``, ``whoami`` and ``hf_hub_download`` call, checks the bearer token, and keeps every commit of every
repo in memory.
Failures are injected per route with :meth:`FakeHub.fail`. A 401 is deliberately careless: it echoes the request's
``Authorization: Bearer <token>`` header, so tests prove that hf_posenc never shows the token. Written against the
client code of huggingface_hub 2.x (``hf_api.py``, ``_commit_api.py``, ``file_download.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import transformers.utils.hub
import yaml
from huggingface_hub import HfApi, ModelCard, constants

EMPTY_COMMIT = "0" * 40


@dataclass
class Repo:
    """One model repo: branch name -> commit id, commit id -> {path: bytes} and its summary line."""

    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        """Commit id of a branch name or a full commit id; None when unknown."""
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None


class FakeHub:
    """Serve the Hub routes on ``127.0.0.1:<free port>`` from a daemon thread.

    Args:
        token (`str`):
            The only bearer token accepted for writes and for private repos.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self._failures: dict[tuple[str, str | None], int] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail(self, route: str, status: int, repo_id: str | None = None) -> None:
        """Answer every later request to ``route`` (e.g. ``"commit"``, ``"create"``, ``"delete-branch"``, ``"info"``,
        ``"resolve"``), or only those about ``repo_id``, with ``status``; a 401 echoes the Authorization header (an
        expired token)."""
        self._failures[route, repo_id] = status

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The files of ``repo_id`` at ``revision`` (empty when the repo or revision does not exist)."""
        repo = self.repos.get(repo_id)
        commit = repo.resolve(revision) if repo else None
        return dict(repo.commits[commit]) if commit else {}

    # Route handlers: each returns (status, json body or bytes, extra headers).

    def create_repo(self, body: dict[str, Any], _: str) -> tuple[int, Any, dict[str, str]]:
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": self._url(repo_id)}, {}
        self.repos[repo_id] = Repo(private=body.get("visibility") == "private")
        self.repos[repo_id].commits[EMPTY_COMMIT] = {}
        self.repos[repo_id].branches["main"] = EMPTY_COMMIT
        return 200, {"url": self._url(repo_id), "name": repo_id}, {}

    def validate_yaml(self, body: dict[str, Any], _: str) -> tuple[int, Any, dict[str, str]]:
        try:
            _front_matter(body["content"])
        except yaml.YAMLError as error:
            return 400, {"errors": [{"message": str(error)}], "warnings": []}, {}
        return 200, {"errors": [], "warnings": []}, {}

    def create_branch(self, repo: Repo, branch: str, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if branch in repo.branches:
            return 409, {"error": f"Branch {branch} already exists"}, {}
        start = repo.resolve(body.get("startingPoint") or "main")
        if start is None:
            return 404, {"error": "Invalid startingPoint"}, {"X-Error-Code": "RevisionNotFound"}
        repo.branches[branch] = start
        return 200, {}, {}

    def delete_branch(self, repo: Repo, branch: str) -> tuple[int, Any, dict[str, str]]:
        if branch not in repo.branches:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        if branch == "main":
            return 403, {"error": "Cannot delete the default branch"}, {}
        del repo.branches[branch]
        return 200, {}, {}

    def preupload(self, repo: Repo, revision: str, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        if repo.resolve(revision) is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        files = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in body["files"]
        ]
        return 200, {"files": files, "commitOid": repo.resolve(revision)}, {}

    def commit(self, repo_id: str, repo: Repo, revision: str, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        parent = repo.branches.get(revision)
        if parent is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        if not lines or lines[0]["key"] != "header":
            return 400, {"error": "The first line must be the commit header"}, {}
        files = dict(repo.commits[parent])
        for line in lines[1:]:
            if line["key"] == "deletedFile" and line["value"]["path"] in files:
                del files[line["value"]["path"]]
            elif line["key"] == "file" and line["value"].get("encoding") == "base64":
                files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            else:
                return 400, {"error": f"Unsupported operation {line['key']!r}"}, {}
        oid = hashlib.sha1(parent.encode() + raw).hexdigest()
        repo.commits[oid] = files
        repo.messages[oid] = lines[0]["value"]["summary"]
        repo.branches[revision] = oid
        return 200, {"commitOid": oid, "commitUrl": f"{self._url(repo_id)}/commit/{oid}", "success": True}, {}

    def model_info(self, repo_id: str, repo: Repo, revision: str) -> tuple[int, Any, dict[str, str]]:
        commit = repo.resolve(revision)
        if commit is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        files = repo.commits[commit]
        info = {
            "id": repo_id,
            "sha": commit,
            "private": repo.private,
            "siblings": [{"rfilename": path} for path in sorted(files)],
            "cardData": _front_matter(files.get("README.md", b"").decode()),
        }
        return 200, info, {}

    def tree(self, repo: Repo, revision: str) -> tuple[int, Any, dict[str, str]]:
        """Every file at ``revision`` as one page of ``list_repo_tree(recursive=True)`` (no folders, no paging)."""
        commit = repo.resolve(revision)
        if commit is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        files = repo.commits[commit]
        entries = [
            {"type": "file", "path": path, "size": len(content), "oid": hashlib.sha1(content).hexdigest()}
            for path, content in sorted(files.items())
        ]
        return 200, entries, {}

    def resolve_file(self, repo: Repo, revision: str, path: str) -> tuple[int, Any, dict[str, str]]:
        commit = repo.resolve(revision)
        if commit is None:
            return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
        headers = {"X-Repo-Commit": commit}
        if path not in repo.commits[commit]:
            return 404, {"error": "Entry not found"}, {**headers, "X-Error-Code": "EntryNotFound"}
        content = repo.commits[commit][path]
        return 200, content, {**headers, "ETag": f'"{hashlib.sha1(content).hexdigest()}"'}

    def _url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"


def _front_matter(readme: str) -> dict[str, Any]:
    """The YAML header of a model card (empty when there is none)."""
    match = re.match(r"^---\n(.*?)\n---\n", readme, flags=re.DOTALL)
    return (yaml.safe_load(match.group(1)) or {}) if match else {}


API_REPO = re.compile(
    r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<verb>preupload|commit|revision|branch|tree)/(?P<rev>[^/]+).*)?$"
)
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
WRITE_ROUTES = ("create", "branch", "delete-branch", "preupload", "commit")
AUTH_ROUTES = (*WRITE_ROUTES, "whoami")  # refused without a token


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._dispatch(send_body=False)

        def do_GET(self) -> None:
            self._dispatch()

        def do_POST(self) -> None:
            self._dispatch()

        def do_DELETE(self) -> None:
            self._dispatch()

        def _dispatch(self, send_body: bool = True) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = urlsplit(self.path).path
            hub.requests.append(Request(self.command, path, self.headers.get("Authorization")))
            with hub._lock:
                status, body, headers = self._route(path, raw)
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header(
                "Content-Type", "application/octet-stream" if isinstance(body, bytes) else "application/json"
            )
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if send_body:
                self.wfile.write(payload)

        def _route(self, path: str, raw: bytes) -> tuple[int, Any, dict[str, str]]:
            route, repo_id, handler = self._match(path, raw)
            if route is None:
                return 404, {"error": f"{self.command} {path} is not served by the fake Hub"}, {}
            token_given = self.headers.get("Authorization")
            failure = hub._failures.get((route, repo_id)) or hub._failures.get((route, None))
            if failure == 401 or (token_given is not None and token_given != f"Bearer {hub.token}"):
                return self._careless_401()
            if failure is not None:
                return failure, {"error": f"Injected failure on {route}"}, {}
            if route in AUTH_ROUTES and token_given is None:
                return 401, {"error": "You must be authenticated"}, {}
            return handler()

        def _careless_401(self) -> tuple[int, Any, dict[str, str]]:
            """Echo the Authorization header in the body, and for HEAD (whose answer has no body) in X-Error-Message:
            huggingface_hub puts both in its error. Only there: httpcore's DEBUG log shows response headers, beyond
            hf_posenc's reach."""
            echo = f"Invalid credentials in Authorization: {self.headers.get('Authorization')}"
            message = echo if self.command == "HEAD" else "Invalid credentials in Authorization header"
            return 401, {"error": echo}, {"X-Error-Message": message}

        def _match(self, path: str, raw: bytes) -> tuple[str | None, str | None, Any]:
            """The route, the repo it is about (None for create and validate-yaml), and its handler."""
            body = json.loads(raw) if raw and self.headers.get("Content-Type") == "application/json" else {}
            if self.command == "POST" and path == "/api/repos/create":
                return "create", None, lambda: hub.create_repo(body, path)
            if self.command == "GET" and path == "/api/whoami-v2":
                return "whoami", None, lambda: (200, {"type": "user", "name": "me", "orgs": []}, {})
            if self.command == "POST" and path == "/api/validate-yaml":
                return "validate-yaml", None, lambda: hub.validate_yaml(body, path)
            api = API_REPO.match(path)
            resolve = RESOLVE.match(path)
            match = api or resolve
            if match is None:
                return None, None, None
            repo_id, revision = unquote(match["repo"]), unquote(match["rev"] or "main")
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and self.headers.get("Authorization") is None):
                missing = (404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                return "missing", repo_id, lambda: missing
            if resolve:
                return "resolve", repo_id, lambda: hub.resolve_file(repo, revision, unquote(resolve["path"]))
            verb = api["verb"] if self.command == "POST" or api["verb"] == "tree" else "info"
            verb = "delete-branch" if self.command == "DELETE" and api["verb"] == "branch" else verb
            handlers = {
                "tree": lambda: hub.tree(repo, revision),
                "branch": lambda: hub.create_branch(repo, revision, body),
                "delete-branch": lambda: hub.delete_branch(repo, revision),
                "preupload": lambda: hub.preupload(repo, revision, body),
                "commit": lambda: hub.commit(repo_id, repo, revision, raw),
                "info": lambda: hub.model_info(repo_id, repo, revision),
            }
            return (verb, repo_id, handlers[verb]) if verb in handlers else (None, None, None)

    return Handler


TOKEN = "hf_FakeTokenForTheLocalHub0123456789"
BASE_REPO = "org/tiny-base"


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """The fake Hub, with huggingface_hub pointed at it and a cache of its own.

    huggingface_hub reads HF_ENDPOINT when it is imported (already done by conftest), so the
    constants it derives, and transformers' shared client, are reset too; subprocesses get the
    environment variables.
    """
    server = FakeHub(TOKEN).start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the "usual login"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)  # transformers' shared client keeps its endpoint
    yield server
    server.stop()


def upload_base(seed: int = 0) -> str:
    """Put a tiny Llama with an Apache-2.0 card on the fake Hub as BASE_REPO; return its commit."""
    from tiny_models import make_tiny

    api = HfApi(token=TOKEN)
    api.create_repo(BASE_REPO, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        make_tiny("llama", seed=seed).save_pretrained(folder)
        ModelCard("---\nlicense: apache-2.0\n---\n# tiny base\n").save(f"{folder}/README.md")
        return api.upload_folder(repo_id=BASE_REPO, folder_path=folder, commit_message="base").oid
