"""Running the app: bind the socket first (a port in use is one line, before any model loading), uvicorn with a
shutdown that ends the engine's streams, and a background-thread variant for tests and the benchmark."""
from __future__ import annotations

import errno
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from model.param_error import ParamError
from serve.engine import Engine


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ParamError("port", f"{port} on {host} is already in use") from None
        raise ParamError("host", f"{host} with {{port}} {port}: cannot bind ({e.strerror})", mentions=("port",)) from None
    sock.listen(128)
    return sock


class Server(uvicorn.Server):
    """uvicorn that, on Ctrl-C / SIGTERM (or `stop`), first stops the engine: running streams then end with
    finish_reason "abort" and their connections close, so the graceful shutdown does not wait on them."""

    def __init__(self, app: FastAPI, engine: Engine, log_level: str = "warning"):
        super().__init__(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10))
        self.engine = engine

    def handle_exit(self, sig, frame) -> None:
        self.engine.shutdown(wait=False)
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        self.handle_exit(None, None)


def serve_in_thread(app: FastAPI, engine: Engine, host: str = "127.0.0.1", port: int = 0,
                    timeout: float = 30.0) -> tuple[Server, threading.Thread, str]:
    """Start the server on a background thread (no signal handlers there); returns it, the thread and its URL.
    Stop it with `server.stop()` and `thread.join()`."""
    sock = bind(host, port)
    server = Server(app, engine)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    return server, thread, f"http://{host}:{sock.getsockname()[1]}"
