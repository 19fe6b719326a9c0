"""A second, independent WebSocket client against a running gateway: Python's `websockets`.

tests/api/websocket_frames.rs runs it (`python3 python_client.py ws://HOST:PORT TOPIC`) after
publishing 3 events to TOPIC. It offers permessage-deflate (the gateway negotiates no extension),
sends a text message in fragments, pings with a payload, consumes and acks the events with a receipt,
then closes with a code the gateway must echo. Any failed check exits non-zero with the reason.
"""

import asyncio
import json
import sys

from websockets.asyncio.client import connect


async def next_frame(ws, kind):
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if frame.get("type") == kind:
            return frame


async def main(base, topic):
    async with connect(f"{base}/ws?client_id=python", open_timeout=10) as ws:
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None, "no extension is negotiated"
        welcome = json.loads(await ws.recv())
        assert welcome["type"] == "welcome", welcome

        # One text message in three fragments (websockets cuts text only between characters;
        # tests/api/websocket_frames.rs cuts one in half).
        await ws.send(['{"op":"ping",', '"req":"fragments ', '✓"}'])
        assert await next_frame(ws, "pong") == {"type": "pong", "req": "fragments ✓"}

        pong = await ws.ping(b"python ping")
        await asyncio.wait_for(pong, 10)

        await ws.send(json.dumps({"op": "subscribe", "topic": topic, "req": "s"}))
        await next_frame(ws, "subscribed")
        events = [await next_frame(ws, "event") for _ in range(3)]
        assert [e["payload"]["n"] for e in events] == [0, 1, 2], events
        ids = [e["delivery_id"] for e in events]
        await ws.send(json.dumps({"op": "ack", "delivery_ids": ids, "req": "a"}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if frame.get("req") == "a":
                assert frame["type"] == "ack_ok", frame
                break

        await ws.close(code=4321, reason="python done")
        assert ws.close_code == 4321, ws.close_code
    print("python client: ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
