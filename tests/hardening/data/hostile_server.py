"""Deliberately hostile HTTP responders, one behaviour per port; runs inside a test host.

Usage: python3 hostile_server.py NAME:PORT... Standard library only (the host has
nothing else). Every connection on a port gets that port's behaviour, whatever the
request. Two special names:
- `replay`: answers with the bytes last staged on the `stage` port, then closes;
- `stage`: reads bytes until the client shuts its side, keeps them for `replay`,
  answers `ok` and closes.
The fuzzer uses the pair to make the server say anything at all.
"""

import socket
import sys
import threading
import time
from collections.abc import Callable

STAGED: list[bytes] = [b""]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready"


def read_head(conn: socket.socket) -> bytes | None:
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(4096)
        if not data:
            return None
        head += data
    return head


def forever(conn: socket.socket, piece: bytes, pause: float = 0.0) -> None:
    while True:
        conn.sendall(piece)
        if pause:
            time.sleep(pause)


def healthy(conn: socket.socket) -> None:
    conn.sendall(OK)


def slowloris(conn: socket.socket) -> None:
    for byte in OK:
        conn.sendall(bytes([byte]))
        time.sleep(1.0)


def endless_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    forever(conn, b"z" * 65536)


def endless_chunked(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    forever(conn, b"10000\r\n" + b"c" * 65536 + b"\r\n")


def content_length_100gb(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 107374182400\r\n\r\n")
    forever(conn, b"g" * 65536)


def huge_header(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * (8 * 1024 * 1024) + b"\r\n\r\n")
    time.sleep(30)


def endless_headers(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    forever(conn, b"X-More: " + b"m" * 100 + b"\r\n")


def endless_informational(conn: socket.socket) -> None:
    forever(conn, b"HTTP/1.1 100 Continue\r\n\r\n", pause=0.001)


def invalid_http(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\x00\xff\xfe garbage\r\n\r\n")


def never_answers(conn: socket.socket) -> None:
    time.sleep(120)


def close_mid_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"r" * 400)


def redirect_loop(conn: socket.socket) -> None:
    conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1/health\r\nContent-Length: 0\r\n\r\n"
    )


def broken_chunked(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nready\r\nzz\r\n")
    time.sleep(30)


def late_answer(conn: socket.socket) -> None:
    time.sleep(29)
    conn.sendall(OK)


def switching_protocols(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\nready")
    time.sleep(30)


def replay(conn: socket.socket) -> None:
    conn.sendall(STAGED[0])


BEHAVIOURS: dict[str, Callable[[socket.socket], None]] = {
    "healthy": healthy,
    "slowloris": slowloris,
    "endless-body": endless_body,
    "endless-chunked": endless_chunked,
    "content-length-100gb": content_length_100gb,
    "huge-header": huge_header,
    "endless-headers": endless_headers,
    "endless-informational": endless_informational,
    "invalid-http": invalid_http,
    "never-answers": never_answers,
    "close-mid-body": close_mid_body,
    "redirect-loop": redirect_loop,
    "broken-chunked": broken_chunked,
    "late-answer": late_answer,
    "switching-protocols": switching_protocols,
    "replay": replay,
}


def serve(conn: socket.socket, behaviour: str) -> None:
    with conn:
        try:
            if behaviour == "stage":
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                STAGED[0] = data
                conn.sendall(b"ok")
                return
            if read_head(conn) is None:
                return
            BEHAVIOURS[behaviour](conn)
        except OSError:
            return


def listen(behaviour: str, port: int) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, behaviour), daemon=True).start()


def main() -> None:
    threads = []
    for spec in sys.argv[1:]:
        name, port = spec.rsplit(":", 1)
        if name != "stage" and name not in BEHAVIOURS:
            raise SystemExit(f"unknown behaviour {name}")
        thread = threading.Thread(target=listen, args=(name, int(port)), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


main()
