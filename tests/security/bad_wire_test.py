#!/usr/bin/python3
"""The bad-input catalogue's second half: hostile flag values and environment on the real
binaries (latchkey-coordinator, latchkey, latchkey-worker), and raw bytes on the coordinator's
gRPC and HTTP ports. Each entry says what answer it expects: an exit code and the flag or reason
in the message; a gRPC status code (read from the HTTP/2 trailers) and its message; an HTTP
status line; or the server closing a connection it cannot speak. After every raw entry the
coordinator must still be running and serving, and at the end the job it stored before is the
only one, unchanged: nothing a hostile peer sends is stored.

Run by ctest: bad_wire_test.py --coordinator BIN --cli BIN --worker BIN --source DIR."""

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print("FAIL: " + what, flush=True)


# --- HTTP/2 and gRPC framing, just enough to send hostile requests -----------------------------
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind, flags, stream, payload):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def literal(name, value):  # HPACK literal header field without indexing, plain strings
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_request(path, message, content_type=b"application/grpc", compressed=0, length=None,
                 extra=b""):
    headers = (literal(b":method", b"POST") + literal(b":scheme", b"http") +
               literal(b":path", path) + literal(b":authority", b"latchkey") +
               literal(b"content-type", content_type) + literal(b"te", b"trailers") + extra)
    n = len(message) if length is None else length
    data = bytes([compressed]) + n.to_bytes(4, "big") + message
    out = PREFACE + frame(4, 0, 0, b"") + frame(1, 4, 1, headers)
    for i in range(0, len(data), 16384):  # the largest frame a peer must accept
        out += frame(0, 1 if i + 16384 >= len(data) else 0, 1, data[i:i + 16384])
    return out


def varint(n):
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def pb_bytes(field, value):
    return bytes([field << 3 | 2]) + varint(len(value)) + value


def hpack_value(resp, name):
    """The value after `name` in a response: gRPC core sends its trailers as plain literals."""
    i = resp.rfind(name)
    if i < 0:
        return None
    i += len(name)
    n = resp[i] & 0x7F
    i += 1
    if n == 127:
        shift = 0
        while True:
            b = resp[i]
            i += 1
            n += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
    return resp[i:i + n].decode("latin-1")


def exchange(port, data, timeout, until=None):
    """Sends `data`, reads until the peer closes, `until(bytes)` holds or `timeout` passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
    except OSError:
        pass
    out, closed, end = b"", False, time.time() + timeout
    try:
        while time.time() < end:
            s.settimeout(max(0.05, end - time.time()))
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            out += chunk
            if until and until(out):
                break
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    s.close()
    return out, closed


# --- the catalogue ------------------------------------------------------------------------------
def flag_cases(a, tmp, addr):
    """(name, argv, env, exit code, substring of the output)."""
    db = os.path.join(tmp, "flags.db")
    not_pem = os.path.join(tmp, "not.pem")
    with open(not_pem, "w") as f:
        f.write("this is not PEM\n")
    coord = [a.coordinator, "--db", db, "--metrics-port", "-1"]
    demo = os.path.join(a.source, "examples", "demo.json")
    w = [a.worker, "--standalone", "--spec", demo, "--quiet"]
    return [
        ("coordinator --listen port out of range", coord + ["--listen", "127.0.0.1:99999"], {}, 2,
         "--listen: '127.0.0.1:99999': port 99999 outside [0, 65535]"),
        ("coordinator --listen without a port", coord + ["--listen", "127.0.0.1"], {}, 2,
         "--listen: '127.0.0.1' is not HOST:PORT"),
        ("coordinator --listen IPv6 without brackets", coord + ["--listen", "::1:50051"], {}, 2,
         "in brackets"),
        ("coordinator --metrics-port out of range", coord + ["--metrics-port", "70000"], {}, 2,
         "--metrics-port: port 70000 outside [-1, 65535]"),
        ("coordinator --max-message-mib 0", coord + ["--max-message-mib", "0"], {}, 2,
         "--max-message-mib"),
        ("coordinator --max-calls-per-peer negative", coord + ["--max-calls-per-peer", "-1"], {}, 2,
         "--max-calls-per-peer: must be >= 0, got -1"),
        ("coordinator --max-model-parameters not a number",
         coord + ["--max-model-parameters", "abc"], {}, 2,
         "--max-model-parameters: 'abc' is not a number"),
        ("coordinator --liveness-timeout 0", coord + ["--liveness-timeout", "0"], {}, 2,
         "--liveness-timeout: must be > 0"),
        ("coordinator --shutdown-grace negative", coord + ["--shutdown-grace", "-5"], {}, 2,
         "--shutdown-grace: must be >= 0"),
        ("coordinator --data-root missing", coord + ["--data-root", "/nonexistent/root"], {}, 2,
         "--data-root"),
        ("coordinator --db-sync unknown", coord + ["--db-sync", "sometimes"], {}, 2, "--db-sync"),
        ("coordinator unknown flag", coord + ["--frobnicate"], {}, 2, "--frobnicate"),
        ("coordinator --tls-cert without --tls-key",
         coord + ["--listen", "127.0.0.1:0", "--tls-cert", not_pem], {}, 1,
         "--tls-cert and --tls-key go together"),
        ("coordinator --tls-cert unreadable",
         coord + ["--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key",
                  "/nonexistent.pem"], {}, 1, "--tls-cert /nonexistent.pem: cannot read"),
        ("coordinator --tls-cert not PEM",
         coord + ["--listen", "127.0.0.1:0", "--tls-cert", not_pem, "--tls-key", not_pem], {}, 1,
         "--tls-cert"),
        ("coordinator --auth-tokens unreadable",
         coord + ["--listen", "127.0.0.1:0", "--auth-tokens", "/nonexistent.tokens"], {}, 1,
         "--auth-tokens /nonexistent.tokens: cannot read"),
        ("coordinator open on a shared address", coord + ["--listen", "0.0.0.0:0"], {}, 1,
         "--auth-tokens is not given"),
        ("coordinator --db in a missing folder",
         [a.coordinator, "--db", "/nonexistent/dir/c.db", "--listen", "127.0.0.1:0",
          "--metrics-port", "-1"], {}, 1, "--db /nonexistent/dir/c.db: cannot open"),
        ("cli --coordinator without a port", [a.cli, "--coordinator", "127.0.0.1", "list"], {}, 3,
         "--coordinator: '127.0.0.1' is not HOST:PORT"),
        ("cli --coordinator port out of range",
         [a.cli, "--coordinator", "127.0.0.1:65536", "list"], {}, 3, "port 65536 outside"),
        ("cli --timeout 0", [a.cli, "--coordinator", addr, "--timeout", "0", "list"], {}, 3,
         "--timeout: must be > 0, got 0"),
        ("cli status without a job", [a.cli, "--coordinator", addr, "status"], {}, 2,
         "job is required"),
        ("cli --tls-ca unreadable",
         [a.cli, "--coordinator", addr, "--tls-ca", "/nonexistent.pem", "list"], {}, 3,
         "--tls-ca: cannot read '/nonexistent.pem'"),
        ("cli --tls-cert without --tls-key",
         [a.cli, "--coordinator", addr, "--tls-cert", not_pem, "list"], {}, 3,
         "--tls-key: required with --tls-cert"),
        ("cli submit of a missing spec",
         [a.cli, "--coordinator", addr, "submit", "/nonexistent/spec.json"], {}, 2,
         "NOT_FOUND: /nonexistent/spec.json: cannot open the job spec"),
        ("cli unreachable coordinator",
         [a.cli, "--coordinator", "127.0.0.1:1", "--timeout", "3", "list"], {}, 6, "UNAVAILABLE"),
        ("cli up --workers 0", [a.cli, "up", "--workers", "0"], {}, 3, "--workers: must be > 0"),
        ("cli up --liveness-timeout negative", [a.cli, "up", "--liveness-timeout", "-1"], {}, 3,
         "--liveness-timeout: must be > 0"),
        ("worker --standalone without --spec", [a.worker, "--standalone"], {}, 2,
         "--spec is required with --standalone"),
        ("worker missing spec file", [a.worker, "--standalone", "--spec", "/nonexistent.json"],
         {}, 1, "/nonexistent.json: cannot open the job spec"),
        ("worker --metrics-port out of range", w + ["--metrics-port", "70000"], {}, 2,
         "--metrics-port: port 70000 outside [-1, 65535]"),
        ("worker --collective-timeout-seconds not whole",
         w + ["--collective-timeout-seconds", "5x"], {}, 2, "--collective-timeout-seconds"),
        ("worker --linger-seconds negative", w + ["--linger-seconds", "-3"], {}, 2,
         "--linger-seconds needs a number >= 0"),
        ("worker unknown flag", w + ["--frobnicate"], {}, 2, "unknown argument '--frobnicate'"),
        ("worker WORLD_SIZE not a number", w, {"WORLD_SIZE": "abc"}, 1,
         "WORLD_SIZE: 'abc' is not a non-negative integer"),
        ("worker RANK outside the world", w, {"WORLD_SIZE": "2", "RANK": "5"}, 1,
         "RANK: 5 outside [0, WORLD_SIZE=2)"),
        ("worker MASTER_PORT out of range", w, {"WORLD_SIZE": "2", "MASTER_PORT": "99999"}, 1,
         "99999 outside [1, 65535]"),
        ("worker unreadable --join-token-file",
         [a.worker, "--coordinator", addr, "--job", "j", "--join-token-file", "/nonexistent.tok"],
         {}, 2, "--join-token-file: cannot read '/nonexistent.tok'"),
    ]


def grpc_cases():
    """(name, bytes, expected gRPC status code or "closed", substring of grpc-message)."""
    submit = b"/latchkey.v1.JobService/SubmitJob"
    join = b"/latchkey.v1.WorkerService/Join"
    identity = pb_bytes(1, pb_bytes(1, b"no-such-job") + pb_bytes(2, b"guess"))
    return [
        ("random bytes instead of HTTP/2", bytes(range(256)) * 16, "closed", ""),
        ("an HTTP/1.1 request", b"GET / HTTP/1.1\r\nHost: latchkey\r\n\r\n", "closed", ""),
        ("a TLS ClientHello to the plaintext port",
         b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100, "closed", ""),
        ("a megabyte of zeros", b"\x00" * (1 << 20), "closed", ""),
        ("a frame claiming 16 MiB after the preface",
         PREFACE + b"\xff\xff\xff\x04\x00\x00\x00\x00\x00" + b"x" * 100, "closed", ""),
        ("a SETTINGS frame of a length not a multiple of 6",
         PREFACE + frame(4, 0, 0, b"x" * 5), "closed", ""),
        ("an unknown method", grpc_request(b"/latchkey.v1.JobService/Frobnicate", b""), 12, ""),
        ("an unknown service", grpc_request(b"/evil.Service/Call", b""), 12, ""),
        ("SubmitJob with bytes that are not a protobuf", grpc_request(submit, b"\xff" * 8), 13,
         ""),
        ("SubmitJob whose length prefix lies (2 GiB, 3 bytes sent)",
         grpc_request(submit, b"abc", length=1 << 31), 13, ""),
        # gRPC reads a message flagged compressed without a usable encoding as it is; the spec
        # inside is still validated.
        ("SubmitJob flagged compressed without an encoding",
         grpc_request(submit, pb_bytes(1, b"{}"), compressed=1), 3, "model: required"),
        ("SubmitJob with an unknown grpc-encoding",
         grpc_request(submit, pb_bytes(1, b"{}"), compressed=1,
                      extra=literal(b"grpc-encoding", b"zstd-9")), 3, "model: required"),
        ("SubmitJob of a spec that is not JSON", grpc_request(submit, pb_bytes(1, b"{\"model\": ")),
         3, "spec: not valid JSON"),
        ("SubmitJob of a spec nested 10000 deep",
         grpc_request(submit, pb_bytes(1, b"[" * 10000 + b"]" * 10000)), 3, "spec"),
        ("GetJob of a job id with a NUL and a newline",
         grpc_request(b"/latchkey.v1.JobService/GetJob", pb_bytes(1, b"job-1\x00\nx")), 5,
         "no such job"),
        ("Join of an unknown job with a guessed token", grpc_request(join, identity), 5,
         "no such job"),
        ("Join with bytes that are not a protobuf (callback service: UNIMPLEMENTED)",
         grpc_request(join, b"\xff" * 8), 12, ""),
    ]


def http_cases():
    """(name, bytes, expected status line prefix, or "closed": no answer to a non-HTTP peer)."""
    get = lambda path, more=b"": b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + more + b"\r\n"
    return [
        ("random bytes", bytes(range(1, 256)) * 4 + b"\r\n\r\n", "HTTP/1.1 400"),
        ("a path escaping the root", get(b"/../../etc/passwd"), "HTTP/1.1 404"),
        ("a URL of 100 kB", get(b"/" + b"a" * 100000), "HTTP/1.1 414"),
        ("a header of 200 kB", get(b"/metrics", b"X-Big: " + b"a" * 200000 + b"\r\n"),
         "HTTP/1.1 400"),
        ("a NUL inside the path", get(b"/met\x00rics"), "HTTP/1.1 400"),
        ("an unknown method", b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400"),
        ("an HTTP/0.9 request line", b"GET /metrics\r\n\r\n", "HTTP/1.1 400"),
        ("a POST to /metrics", b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
         "HTTP/1.1 40"),
        ("a Content-Length of a terabyte",
         b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\nabc",
         "HTTP/1.1 413"),
        ("a broken chunked body",
         b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzzzz\r\n",
         "HTTP/1.1 400"),
        ("a job page for an id with markup", get(b"/jobs/%3Cscript%3E"), "HTTP/1.1 404"),
        ("a TLS ClientHello to the plaintext port",
         b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100, "closed"),
    ]


def run_flags(a, tmp, addr):
    env_base = dict(os.environ, HOME=tmp, XDG_CONFIG_HOME=os.path.join(tmp, "config"))
    env_base.pop("LATCHKEY_TOKEN", None)
    cases = flag_cases(a, tmp, addr)

    def one(case):
        name, argv, env, code, says = case
        p = subprocess.run(argv, env=dict(env_base, **env), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, cwd=tmp)
        out = p.stdout.decode(errors="replace")
        check(p.returncode == code, "%s: exit %d, want %d: %s" % (name, p.returncode, code, out))
        check(says in out, "%s: output lacks %r: %s" % (name, says, out))
        check("Segmentation" not in out and "terminate called" not in out, name + ": crashed")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, cases))
    check(not os.path.exists(os.path.join(tmp, "flags.db")),
          "a refused coordinator start left a database behind")
    return len(cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bad_wire.")
    port_file = os.path.join(tmp, "ports.json")
    server = subprocess.Popen(
        [a.coordinator, "--db", os.path.join(tmp, "coord.db"), "--listen", "127.0.0.1:0",
         "--metrics-host", "127.0.0.1", "--metrics-port", "0", "--port-file", port_file],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "coord.log"), "w"))
    try:
        for _ in range(200):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.05)
        ports = json.load(open(port_file))
        grpc_port, http_port = ports["grpc_port"], ports["metrics_port"]
        addr = "127.0.0.1:%d" % grpc_port
        cli = [a.cli, "--coordinator", addr, "--timeout", "10"]
        spec = os.path.join(a.source, "examples", "demo.json")
        # No worker runs it: its dataset (made by scripts/demo.sh) need not exist here.
        sub = subprocess.run(cli + ["submit", "--no-file-check", spec], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=30)
        check(sub.returncode == 0, "the one good submit failed: %s" % sub.stdout)
        listing = lambda: subprocess.run(cli + ["--json", "list"], stdout=subprocess.PIPE,
                                         timeout=30).stdout
        before = listing()

        n_flags = run_flags(a, tmp, addr)

        def alive(name):
            check(server.poll() is None, name + ": the coordinator died")

        grpc = grpc_cases()
        for name, data, want, says in grpc:
            got_status = lambda b: hpack_value(b, b"grpc-status") is not None
            resp, closed = exchange(grpc_port, data, 10, None if want == "closed" else got_status)
            if want == "closed":
                check(closed, name + ": the connection was not closed")
            else:
                status = hpack_value(resp, b"grpc-status")
                message = hpack_value(resp, b"grpc-message") or ""
                check(status == str(want), "%s: grpc-status %s, want %s (%s)" %
                      (name, status, want, message))
                check(says in message, "%s: grpc-message %r lacks %r" % (name, message, says))
            alive(name)

        http = http_cases()

        def http_one(case):
            name, data, want = case
            head = lambda b: b"\r\n" in b
            resp, closed = exchange(http_port, data, 15, None if want == "closed" else head)
            line = resp.split(b"\r\n", 1)[0].decode("latin-1")
            if want == "closed":
                check(closed and not resp, "%s: answered %r" % (name, line))
            else:
                check(line.startswith(want), "%s: %r, want %s" % (name, line, want))

        with concurrent.futures.ThreadPoolExecutor(len(http)) as pool:
            list(pool.map(http_one, http))
        alive("HTTP entries")

        metrics, _ = exchange(http_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 10,
                              lambda b: b"latchkey_jobs" in b)
        check(b"200 OK" in metrics and b"latchkey_jobs" in metrics,
              "/metrics no longer serves after the hostile entries")
        after = listing()
        check(before == after and b"job-" in after,
              "the stored jobs changed: before %r after %r" % (before, after))
        print("bad_wire_test: %d flag entries, %d gRPC entries, %d HTTP entries" %
              (n_flags, len(grpc), len(http)))
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        return 1
    print("all entries answered as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
