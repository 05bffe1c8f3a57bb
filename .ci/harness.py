"""What the make interop and make stress scripts share: checks and real servers."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGORA = os.path.join(ROOT, "agora.py")
results = []


def check(name, ok, detail=""):
    """Record one check and print its line (with DETAIL when it failed)."""
    results.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""),
          flush=True)


def start_server(db, *options, nofile=None, prefix=()):
    """Start `agora.py serve` on a free port, under the command PREFIX (fiu-run, say) and
    with a soft open-files limit of NOFILE when given (as a shell's usual 1,024 would set
    it); answer (process, base URL)."""
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    process = subprocess.Popen([*prefix, sys.executable, AGORA, "serve", "--addr",
                                "127.0.0.1:0", "--db", db, "--quiet", *options],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=limit if nofile else None)
    line = process.stdout.readline()
    return process, line.split(" listening on ")[1].split(" ")[0]


def stop_server(process):
    """Stop a server; answer what it wrote on stderr."""
    process.terminate()
    return process.communicate(timeout=10)[1]


def mint_token(db, name):
    """Mint NAME's token the operator's way: `agora.py join` on the server's file."""
    out = subprocess.run([sys.executable, AGORA, "join", f"name={name}", "--json", "--db", db],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["token"]


def rest(url, op, args, token=None):
    """Call one operation over agora's REST API; answer (status, body)."""
    request = urllib.request.Request(f"{url}/api/{op}", data=json.dumps(args).encode(),
                                     headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def summary():
    """Print the closing 'N passed, N failed' line; answer the exit status."""
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


def join_many(port, names, threads=8):
    """Join every one of NAMES over REST (keep-alive, in THREADS); answer their tokens."""
    import http.client
    import threading
    tokens, lock = {}, threading.Lock()
    queue = list(names)

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                if not queue:
                    break
                name = queue.pop()
            conn.request("POST", "/api/join", body=json.dumps({"name": name}),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            body = json.loads(response.read())
            if response.status != 200:
                raise SystemExit(f"join {name}: {response.status} {body}")
            with lock:
                tokens[name] = body["token"]
        conn.close()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return [tokens[name] for name in names]


class Crowd:
    """Agents each holding one `read wait` on a connection of its own, from this process:
    raw sockets, their answers gathered with a selector (no thread per waiter)."""

    def __init__(self, port, tokens, wait=60):
        import resource
        import socket
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        body = json.dumps({"wait": wait}).encode()
        self.sockets, self.answers = [], {}
        for token in tokens:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(f"POST /api/read HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                         f"Authorization: Bearer {token}\r\nContent-Type: application/json"
                         f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            self.sockets.append(sock)

    def answered(self):
        """Answer how many waiters have an answer (or a closed connection) already."""
        import select
        poller = select.poll()
        for sock in self.sockets:
            poller.register(sock, select.POLLIN)
        return len(poller.poll(0))

    def gather(self, seconds, since=None):
        """Read every answer that comes within SECONDS; answer a list of (seconds after
        SINCE when it was whole, status, parsed body) in the order they came."""
        import selectors
        since = time.monotonic() if since is None else since
        selector = selectors.DefaultSelector()
        buffers = {}
        for sock in self.sockets:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            buffers[sock] = b""
        done = []
        deadline = time.monotonic() + seconds
        while buffers and time.monotonic() < deadline:
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                sock = key.fileobj
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                buffers[sock] += chunk
                head, _, rest = buffers[sock].partition(b"\r\n\r\n")
                length = None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if chunk and (length is None or len(rest) < length):
                    continue
                status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
                try:
                    body = json.loads(rest[:length]) if length else None
                except ValueError:
                    body = None
                done.append((time.monotonic() - since, status, body))
                selector.unregister(sock)
                del buffers[sock]
        selector.close()
        return done

    def close(self):
        """Hang up every waiter."""
        for sock in self.sockets:
            sock.close()

