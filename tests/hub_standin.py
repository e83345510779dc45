"""A local stand-in for the Hugging Face hub: the few endpoints `huggingface_hub` calls to create a repo and
upload a folder (files sent inline as base64, never as LFS/xet blobs). Bound to 127.0.0.1 on a free port; it
serves at most `max_requests` requests and stops itself after `timeout` seconds.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HubStandIn:
    def __init__(self, token: str, max_requests: int = 50, timeout: float = 60.0):
        self.token, self.max_requests, self.deadline = token, max_requests, time.monotonic() + timeout
        self.requests: list[tuple[str, str]] = []
        self.repos: dict[str, dict[str, bytes]] = {}  # repo id -> committed files
        self.created: dict[str, dict] = {}  # repo id -> the create request (name, private, type, ...)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.timeout = 0.2
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.deadline = 0.0
        self._thread.join(timeout=5)
        self.server.server_close()

    def _serve(self) -> None:
        while time.monotonic() < self.deadline and len(self.requests) < self.max_requests:
            self.server.handle_request()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path))
                self._reply(404, {"error": "not served by the stand-in"})

            def do_POST(self) -> None:
                hub.requests.append(("POST", self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "repos", "create"]:
                    request = json.loads(body)
                    repo = f"{request.get('organization') or 'tester'}/{request['name']}"
                    hub.repos.setdefault(repo, {})
                    hub.created[repo] = request
                    return self._reply(200, {"url": f"{hub.url}/{repo}", "name": repo})
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    repo = f"{parts[2]}/{parts[3]}"
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item.get("key") == "file":
                            value = item["value"]
                            hub.repos.setdefault(repo, {})[value["path"]] = base64.b64decode(value["content"])
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{'0' * 40}",
                                             "commitOid": "0" * 40, "pullRequestUrl": None})
                self._reply(404, {"error": "not served by the stand-in"})

        return Handler
