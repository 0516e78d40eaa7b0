"""Frames framed once per fan-out and written straight to each viewer's socket.

Under daphne a consumer's ASGI `send` is `functools.partial(server.handle_reply,
protocol)` (behind channels' session middleware): a frame sent through it goes consumer
-> handle_reply -> autobahn's sendMessage, which frames the payload again for every
viewer and formats its debug-log arguments on every call even with logging off (~20 us
a viewer and frame, of which ~10 the log arguments). A `Broadcast` frames each update's
messages once (autobahn's PreparedMessage, its documented broadcast API) and writes the
bytes to every socket whose `send` is daphne's, on the same event loop (daphne runs
Twisted on asyncio), so the write keeps its place among the consumer's other sends.
Anything else (another server, the in-memory test communicator, a socket not open,
compression negotiated, frames queued in autobahn) takes the ASGI send as before."""

from __future__ import annotations

import functools
import sys
from typing import Any

from channels.sessions import InstanceSessionWrapper

from diagnosis.live_render import Update


class Direct:
    """Where a viewer's frames can be written directly: daphne's server and the viewer's
    autobahn protocol."""

    __slots__ = ("connections", "protocol")

    def __init__(self, connections: dict[Any, dict[str, Any]], protocol: Any) -> None:
        self.connections = connections
        self.protocol = protocol


def direct(send: Any) -> Direct | None:
    """The direct writer behind an ASGI `send`, when it is daphne's; else None."""
    # channels' session middleware wraps send only to save the session with an HTTP
    # response's start: a WebSocket frame passes straight through it.
    while isinstance(getattr(send, "__self__", None), InstanceSessionWrapper):
        send = send.__self__.real_send
    server_module = sys.modules.get("daphne.server")  # not loaded: not under daphne
    if server_module is None or not isinstance(send, functools.partial) or len(send.args) != 1:
        return None
    server = getattr(send.func, "__self__", None)
    if not isinstance(server, server_module.Server) or send.func.__name__ != "handle_reply":
        return None
    protocol = send.args[0]
    if not callable(getattr(protocol, "sendPreparedMessage", None)):
        return None
    return Direct(server.connections, protocol)


def send_now(transport: Any, data: bytes) -> bool:
    """`transport.write(data)`, sent at once when the socket has nothing waiting (True
    then: all of it went to the socket).

    Twisted's TCP transport buffers every write until the loop reports the socket
    writable: an epoll registration, a loop turn and a deregistration per viewer, about
    half of a fan-out's CPU per viewer under py-spy. A socket with nothing buffered takes
    the bytes now (Twisted's own writeSomeData); what it does not take, and any socket
    with data waiting, TLS or a paused producer, goes through `write`, after what is
    waiting."""
    pending = getattr(transport, "_tempDataLen", None)
    if (
        pending != 0
        or getattr(transport, "TLS", True)
        or not getattr(transport, "connected", False)
        or getattr(transport, "disconnecting", True)
        or getattr(transport, "_writeDisconnected", True)
        # HTTPChannel stays the socket's streaming producer: paused, its buffer filled.
        or getattr(transport, "producerPaused", True)
        or not (
            getattr(transport, "producer", None) is None
            or getattr(transport, "streamingProducer", False)
        )
        or getattr(transport, "offset", None) != len(getattr(transport, "dataBuffer", b"x"))
        or not callable(getattr(transport, "writeSomeData", None))
    ):
        transport.write(data)
        return False
    sent = transport.writeSomeData(data)
    if isinstance(sent, Exception) or sent < 0:
        transport.write(data)  # the connection is lost: Twisted's write path closes it
        return False
    if sent < len(data):
        transport.write(data[sent:])
        return False
    return True


class Broadcast:
    """One fan-out's (or pull's) frames, framed once per update and written to each
    viewer that can take them directly; counts what went which way."""

    def __init__(self) -> None:
        self.prepared: dict[int, tuple[Update, list[Any]]] = {}
        self.direct = 0  # frames written straight to a socket, all at once
        self.buffered = 0  # frames written to daphne's transport, sent when writable
        self.asgi = 0  # frames sent through the ASGI send

    def write(self, to: Direct | None, update: Update) -> bool:
        """Write `update`'s frames to `to`; False when they must go through the ASGI
        send instead (nothing written then)."""
        if to is None:
            return False
        protocol = to.protocol
        # What daphne's handle_reply checks first: a socket it has let go of is skipped.
        state = to.connections.get(protocol)
        if state is None or state.get("disconnected"):
            return True
        if (
            protocol.state != protocol.STATE_OPEN
            or protocol.websocket_extensions_in_use  # compression: framed per socket
            or protocol.send_queue  # autobahn's own queue first, in order
        ):
            return False
        transport = protocol.transport
        for message in self.frames(update):
            # What autobahn's sendData does with a prepared message on an idle socket,
            # without formatting its debug-log arguments per call.
            if send_now(transport, message.payloadHybi):
                self.direct += 1
            else:
                self.buffered += 1
        return True

    def frames(self, update: Update) -> list[Any]:
        found = self.prepared.get(id(update))
        if found is None or found[0] is not update:
            from autobahn.websocket.protocol import PreparedMessage

            # Server frames are not masked; kept with their payload (doNotCompress off).
            messages = [PreparedMessage(f.encode(), False, False, False) for f in update.frames]
            found = self.prepared[id(update)] = (update, messages)
        return found[1]
