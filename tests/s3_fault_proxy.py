#!/usr/bin/env python3
"""s3_fault_proxy.py - an HTTP proxy in front of an S3 server that injects faults, for tests.

    python3 tests/s3_fault_proxy.py --upstream http://127.0.0.1:18480 --port-file F --log L \
        --rule 'GET:partNumber:slowdown:3' ...

Listens on 127.0.0.1 (a free port, written to --port-file once it listens) and passes every request to
--upstream unchanged (the Host header too, so SigV4 signatures stay valid), except those a rule picks.
A rule is METHOD:PATTERN:ACTION[:ARG]:TIMES[:SKIP] - METHOD (or *) and a regular expression searched
in the request target (path and query) pick requests; the first SKIP of them pass, the next TIMES get
ACTION, the rest pass again. Actions:
    slowdown        answer 503 with an S3 SlowDown error document
    error:STATUS    answer STATUS with an S3 error document (InternalError for 5xx, else InvalidRequest)
    error:STATUS/CODE  answer STATUS with an S3 error document of that Code (never forwarded): e.g.
                    200/InternalError (CompleteMultipartUpload's failure inside a 200, which AWS documents),
                    400/InternalError (a gateway's 400 wrapping a server fault), 400/InvalidPart
    drop            read the request, close the connection without an answer (never forwarded)
    reset           read the request head, then reset the connection (RST) before its body
    stall:SECONDS   read the request, send nothing for SECONDS, then close (never forwarded)
    delay:SECONDS   read the request, wait SECONDS, then forward it and pass the answer on (a slow link)
    truncate:BYTES  forward, then send the answer's head and only BYTES of its body, and close
    lose            forward (the server acts on it), then close without passing the answer on
    answer:FILE     answer 200 with FILE's bytes as the body (application/xml; never forwarded): a listing
                    or any other document a hostile or broken server might send
    etags           forward, then pass the answer on with every <ETag> in its body changed (each hex digit
                    shifted by one): a server whose listings give another ETag than its GETs and HEADs do
Each request is logged to --log as a JSON line {"id", "method", "target", "action", "range", "start"} (its
Range header, "" when none; start in time.monotonic() seconds) before it is forwarded or answered, so a
client that has its answer finds its request in the log. A forwarded request's answer adds a second line
{"answered": id, "status", "end"} once the server's answer has come whole and before it is passed on (end:
when the server was done with it), so that the log shows which requests were in flight together and is
complete, answers included, by the time the client has them. Standard library only; exits after
--max-seconds (default 300) whatever happens.
"""
import argparse
import json
import os
import re
import socket
import socketserver
import struct
import sys
import threading
import time
from urllib.parse import urlsplit

SLOWDOWN = (b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>SlowDown</Code>"
            b"<Message>Please reduce your request rate.</Message></Error>")
INTERNAL = (b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>InternalError</Code>"
            b"<Message>We encountered an internal error. Please try again.</Message></Error>")
INVALID = (b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>InvalidRequest</Code>"
           b"<Message>Injected by the fault proxy.</Message></Error>")


def error_doc(code):
    """An S3 error document of `code`, its message saying who sent it."""
    return (b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>%s</Code><Message>%s injected by the fault "
            b"proxy.</Message></Error>" % (code.encode(), code.encode()))


class Rule:
    def __init__(self, text):
        parts = text.split(":")
        if len(parts) < 4:
            raise SystemExit(f"bad rule {text!r}: METHOD:PATTERN:ACTION[:ARG]:TIMES[:SKIP]")
        self.method, pattern, self.action = parts[0], parts[1], parts[2]
        rest = parts[3:]
        self.arg, self.code = None, ""
        if self.action in ("error", "stall", "delay", "truncate", "answer"):
            arg = rest.pop(0)
            if self.action == "error":
                arg, _, self.code = arg.partition("/")
            self.arg = float(arg) if self.action in ("stall", "delay") else arg if self.action == "answer" else int(arg)
        self.times = int(rest[0])
        self.skip = int(rest[1]) if len(rest) > 1 else 0
        self.regex = re.compile(pattern)
        self.seen = 0
        self.lock = threading.Lock()

    def pick(self, method, target):
        if self.method not in ("*", method) or not self.regex.search(target):
            return False
        with self.lock:
            n = self.seen
            self.seen += 1
        return self.skip <= n < self.skip + self.times


def read_head(sock, buf):
    """(head bytes, rest) of the next message, or (None, buf) at EOF."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return None, buf
        buf += data
        if len(buf) > 1 << 20:
            raise ValueError("head too large")
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head + b"\r\n\r\n", rest


def header(head, name):
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            if k.strip().lower() == name:
                return v.strip()
    return None


def read_exact(sock, buf, n):
    buf = bytearray(buf)  # appended in place: a 16 MiB body in 64 KiB pieces is not copied again for each piece
    while len(buf) < n:
        data = sock.recv(max(65536, n - len(buf)))
        if not data:
            raise ConnectionError("peer closed")
        buf += data
    return bytes(buf[:n]), bytes(buf[n:])


def read_response(up, method):
    """The upstream's whole answer (head, body bytes as framed on the wire, decoded body length)."""
    head, rest = read_head(up, b"")
    if head is None:
        raise ConnectionError("upstream closed")
    status = int(head.split(b" ", 2)[1])
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return head, b""
    length = header(head, b"content-length")
    if length is not None:
        body, _ = read_exact(up, rest, int(length))
        return head, body
    if (header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        wire = rest
        while not wire.endswith(b"0\r\n\r\n"):
            data = up.recv(65536)
            if not data:
                break
            wire += data
        return head, wire
    while True:
        data = up.recv(65536)
        if not data:
            return head, rest
        rest += data


SHIFTED = str.maketrans("0123456789abcdefABCDEF", "123456789abcdef0BCDEFA")


def other_etags(head, body):
    """The answer with each <ETag> of its body changed, framed with a Content-Length."""
    if (header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        plain, rest = b"", body
        while True:
            size_line, rest = rest.split(b"\r\n", 1)
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                break
            plain, rest = plain + rest[:n], rest[n + 2:]
        body = plain
    body = re.sub(rb"<ETag>(.*?)</ETag>",
                  lambda m: b"<ETag>" + m.group(1).decode("latin-1").translate(SHIFTED).encode("latin-1")
                  + b"</ETag>", body)
    lines = [line for line in head.split(b"\r\n") if line and
             line.split(b":")[0].strip().lower() not in (b"content-length", b"transfer-encoding")]
    return b"\r\n".join(lines + [b"Content-Length: %d" % len(body)]) + b"\r\n\r\n", body


class Handler(socketserver.BaseRequestHandler):
    def send_error_doc(self, status, reason, body):
        self.request.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                             % (status, reason, len(body)) + body)

    def handle(self):
        sock = self.request
        buf = b""
        try:
            while True:
                head, buf = read_head(sock, buf)
                if head is None:
                    return
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, target = line.split(" ")[0], line.split(" ")[1]
                rule = next((r for r in self.server.rules if r.pick(method, target)), None)
                action = rule.action if rule else "pass"
                request_id = self.server.next_id()
                self.server.log({"id": request_id, "method": method, "target": target, "action": action,
                                 "range": (header(head, b"range") or b"").decode("latin-1"),
                                 "start": time.monotonic()})
                if action == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
                    return
                length = int(header(head, b"content-length") or 0)
                body, buf = read_exact(sock, buf, length)
                if action == "slowdown":
                    self.send_error_doc(503, b"Slow Down", SLOWDOWN)
                    continue
                if action == "error":
                    doc = error_doc(rule.code) if rule.code else INTERNAL if rule.arg >= 500 else INVALID
                    self.send_error_doc(rule.arg, b"OK" if rule.arg == 200 else b"Error", doc)
                    continue
                if action == "answer":
                    with open(rule.arg, "rb") as f:
                        self.send_error_doc(200, b"OK", f.read())
                    continue
                if action == "drop":
                    sock.close()
                    return
                if action == "stall":
                    time.sleep(rule.arg)
                    sock.close()
                    return
                if action == "delay":
                    time.sleep(rule.arg)
                up = socket.create_connection(self.server.upstream, timeout=120)
                try:
                    up.sendall(head + body)
                    rhead, rbody = read_response(up, method)
                finally:
                    up.close()
                self.server.log({"answered": request_id, "status": int(rhead.split(b" ", 2)[1]),
                                 "end": time.monotonic()})
                if action == "lose":
                    sock.close()
                    return
                if action == "truncate":
                    sock.sendall(rhead + rbody[:rule.arg])
                    sock.close()
                    return
                if action == "etags":
                    rhead, rbody = other_etags(rhead, rbody)
                sock.sendall(rhead + rbody)
                if (header(rhead, b"connection") or b"").lower() == b"close":
                    return
        except (ConnectionError, OSError, ValueError):
            return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Clients open many connections at once (16 ranged GETs or part PUTs): a short accept queue drops SYNs,
    # which the kernel resends a second later, and the log would show that second as the client's gap.
    request_queue_size = 128

    def __init__(self, upstream, rules, log_path):
        super().__init__(("127.0.0.1", 0), Handler)
        self.upstream = upstream
        self.rules = rules
        self.log_lock = threading.Lock()
        self.log_file = open(log_path, "a", buffering=1) if log_path else None
        self.requests = 0

    def next_id(self):
        with self.log_lock:
            self.requests += 1
            return self.requests

    def log(self, entry):
        if self.log_file:
            with self.log_lock:
                self.log_file.write(json.dumps(entry) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--rule", action="append", default=[])
    ap.add_argument("--max-seconds", type=float, default=300)
    a = ap.parse_args()
    up = urlsplit(a.upstream)
    server = Server((up.hostname, up.port or 80), [Rule(r) for r in a.rule], a.log)
    threading.Timer(a.max_seconds, lambda: os._exit(3)).start()
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, a.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
