"""An HTTP server that misbehaves on purpose, one way per path; runs inside a test host.

Usage: python3 misbehaving_server.py PORT. Standard library only (the host has nothing
else). Each connection reads one request head, then answers as its path says.
"""

import socket
import struct
import sys
import threading
import time


def answer(conn: socket.socket, path: str) -> None:
    if path == "/ok":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready")
    elif path == "/status-500":
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom")
    elif path == "/big-headers":
        filler = b"X-Filler: " + b"a" * 40000 + b"\r\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 0\r\n\r\n")
    elif path == "/big-declared-body":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3000000\r\n\r\n" + b"x" * 1000)
        time.sleep(2)
    elif path == "/big-chunked-body":
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"y" * 16384
        try:
            for _ in range(1000):
                conn.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:
            return
    elif path == "/close-early":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    elif path == "/close-now":
        pass
    elif path == "/reset":
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif path == "/garbage":
        conn.sendall(b"garbage\r\n\r\n")
    elif path == "/slow":
        time.sleep(10)
    elif path == "/drip":
        try:
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready":
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            return


def serve(conn: socket.socket) -> None:
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        path = head.split(b" ", 2)[1].decode()
        answer(conn, path)


def main() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[1])))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
