"""A live server for the serving tests: a tiny random char model behind uvicorn on 127.0.0.1, on a free port, in a
background thread that the fixture stops."""
from __future__ import annotations

import contextlib
from typing import Iterator

from data.tokenizers import CharTokenizer
from serve.app import create_app
from serve.engine import Engine
from serve.server import serve_in_thread
from tests.inference_fixtures import TEXT, tiny_model

TOK = CharTokenizer.from_text(TEXT)
MODEL_NAME = "tiny-test"


@contextlib.contextmanager
def live_server(api_key: str | None = None, max_batch: int = 8, max_tokens: int = 200, block_size: int = 32
                ) -> Iterator[tuple[str, Engine]]:
    model = tiny_model(0, vocab_size=TOK.vocab_size, block_size=block_size)
    engine = Engine(model, TOK, max_batch=max_batch)
    app = create_app(engine, MODEL_NAME, api_key=api_key, max_tokens=max_tokens)
    server, thread, url = serve_in_thread(app, engine)
    try:
        yield url, engine
    finally:
        server.stop()
        thread.join(timeout=30)
        engine.shutdown()
        assert not thread.is_alive(), "the server did not stop"
