"""The operator's pod-facing routes (signer/) served on a loopback port by a real aiohttp
server, in a thread of its own: the pod-side clients under test talk HTTP to them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class RouteThread:
    """`routes` (aiohttp RouteDefs) on http://127.0.0.1:<port> (`url`) until stop()."""

    def __init__(self, routes: list[Any], client_max_size: int = 1 << 20) -> None:
        self.loop = asyncio.new_event_loop()
        self.routes, self.client_max_size, self.url = routes, client_max_size, ""
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=self.client_max_size)
        app.add_routes(self.routes)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
