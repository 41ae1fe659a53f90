"""A stand-in for the Hugging Face Hub on 127.0.0.1 (there is no Hub here): the five endpoints that
``huggingface_hub``'s own ``create_repo``, ``create_branch`` and ``upload_folder`` call (repos/create, branch,
validate-yaml, preupload, commit), every file answered as a regular (non-LFS) upload, so that the commit
carries its bytes. It keeps each branch's files, the commits in order and every request it could not answer
(``unknown``), so a test sees exactly what a push sent."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.servers import free_port

REPO_ACTION = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<action>branch|preupload|commit)/(?P<rev>[^/?]+)")


class FakeHub:
    """``url`` is the endpoint (``HF_ENDPOINT``); ``repos[repo][branch]`` the files (path -> bytes)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.commits: list[dict[str, Any]] = []
        self.unknown: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, answer = hub.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                hub.unknown.append(f"GET {self.path}")
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)

    def start(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, body: bytes) -> tuple[int, Any]:
        if path.startswith("/api/repos/create"):
            doc = json.loads(body)
            repo = f"{doc['organization']}/{doc['name']}" if doc.get("organization") else doc["name"]
            if repo in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo}"}
            self.repos[repo] = {"main": {}}
            return 200, {"url": f"{self.url}/{repo}"}
        if path.startswith("/api/validate-yaml"):
            return 200, {"errors": [], "warnings": []}
        m = REPO_ACTION.match(path)
        if m is None or m["repo"] not in self.repos:
            self.unknown.append(f"POST {path}")
            return 404, {"error": "not found"}
        branches, rev = self.repos[m["repo"]], m["rev"]
        if m["action"] == "branch":
            branches.setdefault(rev, dict(branches["main"]))  # from main, as the Hub makes a branch
            return 200, {}
        if m["action"] == "preupload":
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
        if rev not in branches:
            return 404, {"error": f"revision {rev} not found"}
        lines = [json.loads(x) for x in body.splitlines() if x.strip()]
        added = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
        branches[rev].update(added)
        oid = hashlib.sha1(json.dumps(sorted(added)).encode() + str(len(self.commits)).encode()).hexdigest()
        header = next((x["value"] for x in lines if x["key"] == "header"), {})
        self.commits.append({"repo": m["repo"], "revision": rev, "oid": oid, "files": sorted(added),
                             "summary": header.get("summary", "")})
        return 200, {"commitUrl": f"{self.url}/{m['repo']}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
