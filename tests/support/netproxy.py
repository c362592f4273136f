"""A TCP proxy process for partition proofs: ``python -m tests.support.netproxy LISTEN_PORT TARGET_PORT``
(127.0.0.1 both sides). It forwards until it gets ``SIGUSR1``, then **stalls**: it stops reading
and writing on every connection and connects nothing new (accepted clients wait), without closing
anything — the peer sees a server that never answers, no RST, no FIN (a hung database; the kernel
still ACKs, so TCP keepalives do not fire: for a dead *host* use an iptables DROP). ``SIGUSR2``
forwards again. It prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import signal
import sys


class Proxy:
    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.flowing.clear)
        loop.add_signal_handler(signal.SIGUSR2, self.flowing.set)
        server = await asyncio.start_server(self._client, "127.0.0.1", self.listen_port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        await self.flowing.wait()
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        await asyncio.gather(self._pipe(cr, sw), self._pipe(sr, cw), return_exceptions=True)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.flowing.wait()
                data = await r.read(65536)
                if not data:
                    break
                await self.flowing.wait()  # stalled meanwhile: hold what was read
                w.write(data)
                await w.drain()
        finally:
            w.close()


if __name__ == "__main__":
    asyncio.run(Proxy(int(sys.argv[1]), int(sys.argv[2])).serve())
