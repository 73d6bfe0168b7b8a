"""Replaces vLLM's top-level tests/conftest.py, which needs torch, vLLM's engine
and Hugging Face models: only what the selected tests use is defined here."""

import http.server
import threading
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest


class LocalAssetServer:
    """A local HTTP server for test assets, as vLLM's. It serves an empty
    directory: the multimodal tests that fetch images from it are deselected."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.address = address
        self.port = -1
        self.server = None
        self.thread = None
        self._dir = None

    def __enter__(self):
        self._dir = TemporaryDirectory()
        directory = self._dir.name

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

        self.server = http.server.ThreadingHTTPServer((self.address, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.thread.join()
        self._dir.cleanup()
        return False

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def url_for(self, name: str) -> str:
        return f"{self.base_url}/{Path(name).name}"


@pytest.fixture(scope="session")
def local_asset_server():
    with LocalAssetServer() as srv:
        yield srv
