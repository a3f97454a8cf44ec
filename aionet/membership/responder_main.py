"""Liveness responder: a tiny sidecar process that answers for a node's *process*.

Why a separate process: a node's event loop runs user code, and a C call holding the GIL
(a big ``sum``, a regex, an import) blocks every thread of the process, so neither the loop
nor a helper thread can prove the process alive then. This script imports only the standard
library (started with ``python -I -S``), owns one UDP socket, and answers a ping with how long
the node's loop has not ticked. It stays silent while the node is stopped (SIGSTOP, a paused
VM) and exits when the node is gone, so silence still means "frozen or dead".

Protocol (one datagram each way, both 32 bytes: a ping is padded to the size of its reply,
so a forged source address cannot turn the responder into an amplifier)::

    ping  = b"AIOP" + nonce(8) + zeros(20)
    reply = b"AIOR" + nonce(8) + stall_ms(uint32, big-endian) + mac(16)

``mac`` is HMAC-SHA256 over the reply's first 16 bytes, keyed with the cluster token (zeros
without one), truncated to 16 bytes. ``stall_ms`` 0xFFFFFFFF means the node is stopped, exiting
(killed: its memory and sockets are being torn down) or gone (answered at once, so a pinger
need not wait out its timeout). The node passes its pid, the tick file and the token on stdin
(never on the command line, which other users can read), and reads the bound port from this
process's stdout.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import mmap
import os
import select
import socket
import struct
import sys
import time

PING = b"AIOP"
REPLY = b"AIOR"
PARENT_CHECK = 0.2  # s between checks that the node still exists
PING_SIZE = 32  # = the reply's size: answering never amplifies
NOT_RUNNING = 0xFFFFFFFF  # stall_ms meaning "the node is stopped, exiting or gone"
PF_EXITING = 0x4  # task flag (linux/sched.h): the process has begun to exit (killed or returning)


def stat_state(data: bytes) -> str:
    """The state letter of a ``/proc/<pid>/stat`` line, 'X' while the process is exiting.

    Why the flags matter: a SIGKILLed process first unmaps its memory and closes its sockets
    (its peers see the connection drop and ping us) and only then becomes a zombie; under CPU
    load that takes tens of milliseconds, during which its state letter still says running.
    The kernel sets PF_EXITING in the flags (the 7th field after the command name) as the
    exit begins, so that window reads as gone, not as a running loop with a short stall."""
    end = data.rfind(b")")
    if end <= 0:
        return ""
    fields = data[end + 2 :].split()
    if not fields:
        return ""
    state = fields[0].decode(errors="replace")
    if len(fields) > 6 and fields[6].isdigit() and int(fields[6]) & PF_EXITING:
        return "X"
    return state


def parent_state(pid: int) -> str:
    """The node's scheduler state letter from /proc ('R', 'S', 'T' stopped, 'X' exiting ...),
    '' if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return ""
    return stat_state(data)


def serve(pid: int, host: str, tick_path: str, token: bytes) -> None:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sys.stdout.write(f"{sock.getsockname()[1]}\n")
    sys.stdout.flush()
    with open(tick_path, "r+b") as f:
        ticks = mmap.mmap(f.fileno(), 8)
    with contextlib.suppress(OSError):  # both sides have it mapped: nothing is left behind,
        os.unlink(tick_path)  # even when the node is SIGKILLed
    key = token or b"\0" * 16
    next_check = 0.0
    while True:
        ready, _w, _x = select.select([sock], [], [], PARENT_CHECK)
        now = time.monotonic()
        if now >= next_check or ready:
            state = parent_state(pid)
            next_check = now + PARENT_CHECK
        if not ready:
            if state in ("", "Z", "X"):
                return  # the node is gone: so is its responder
            continue
        try:
            data, addr = sock.recvfrom(64)
        except OSError:
            continue
        if len(data) != PING_SIZE or data[:4] != PING:
            continue
        if state in ("", "Z", "X", "T", "t"):
            stall_ms = NOT_RUNNING  # stopped, exiting or gone: say so now rather than let the pinger wait
        else:
            (tick,) = struct.unpack_from("<d", ticks, 0)
            stall_ms = min(max(int((time.monotonic() - tick) * 1000), 0), NOT_RUNNING - 1)
        body = REPLY + data[4:12] + struct.pack(">I", stall_ms)
        mac = hmac.new(key, body, hashlib.sha256).digest()[:16]
        try:
            sock.sendto(body + mac, addr)
        except OSError:
            pass


def main() -> None:
    pid_s, host, tick_path, token_hex = sys.stdin.readline().split()
    serve(int(pid_s), host, tick_path, bytes.fromhex(token_hex) if token_hex != "-" else b"")


if __name__ == "__main__":
    main()
