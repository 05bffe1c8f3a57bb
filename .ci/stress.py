"""make stress: agora's promises under races, crashes, hostile input and slow clients.

Each check runs real processes against one file on loopback, is bounded in
count and time, and stops by itself; the run ends with 'N passed, N failed'.
Standard library only.
"""

import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGORA, ROOT, Crowd, check, join_many, mint_token, start_server,  # noqa
                     stop_server, summary)
sys.path.insert(0, ROOT)
import agora  # noqa: E402


STARTED = []    # every server process, so that none outlives a check that stopped early


def serve(db, *options):
    """Start a server; answer (process, port)."""
    process, url = start_server(db, *options)
    STARTED.append(process)
    return process, int(url.rsplit(":", 1)[1])


def request(port, method, path, body=None, token=None, timeout=30):
    """One request on a new connection; answer (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")
    finally:
        conn.close()


def posts_meanwhile(port, token, seconds):
    """Post one after another for SECONDS; answer each post's milliseconds (all 200)."""
    latencies, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.perf_counter()
        status, _ = request(port, "POST", "/api/post", {"body": f"post {len(latencies)}"},
                            token)
        latencies.append((time.perf_counter() - began) * 1000)
        assert status == 200, status
    return latencies


REST_CLAIMER = """
import http.client, json, sys, time
port, token = int(sys.argv[1]), sys.argv[2]
won = []
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
while True:
    conn.request("POST", "/api/claim", body="{}", headers={"Authorization": "Bearer " + token})
    response = conn.getresponse()
    answer = json.loads(response.read())
    if response.status == 404:
        break
    assert response.status == 200, answer
    won.append(answer["task"]["id"])
    time.sleep(0.05)        # the work between claims, so the slower CLI claimers contend too
print(" ".join(map(str, won)))
"""

CLI_CLAIMER = """
import subprocess, sys, json
agora, db, name = sys.argv[1:4]
won = []
while True:
    done = subprocess.run([sys.executable, agora, "claim", "--as", name, "--json", "--db", db],
                          capture_output=True, text=True)
    if done.returncode == 1 and "no open task" in done.stderr:
        break
    assert done.returncode == 0, done.stderr
    won.append(json.loads(done.stdout)["task"]["id"])
print(" ".join(map(str, won)))
"""


def claim_races(work):
    """Several REST clients and CLI processes claim from one board: one winner per task."""
    db = os.path.join(work, "claims.db")
    server, port = serve(db)
    try:
        store = agora.Store(db)
        ids = [agora.call(store, "post_task", {"title": f"task {i}"},
                          agora.Caller("boss", True)).body["id"] for i in range(150)]
        store.close()
        workers = [subprocess.Popen([sys.executable, "-c", REST_CLAIMER, str(port),
                                     mint_token(db, f"rest{i}")], stdout=subprocess.PIPE, text=True)
                   for i in range(3)]
        workers += [subprocess.Popen([sys.executable, "-c", CLI_CLAIMER, AGORA, db, f"cli{i}"],
                                     stdout=subprocess.PIPE, text=True) for i in range(2)]
        won, by_kind = [], []
        for worker in workers:
            out, _ = worker.communicate(timeout=120)
            by_kind.append(len(out.split()))
            won += [int(x) for x in out.split()]
        check(f"claim race: {len(ids)} tasks, one winner each; REST clients won "
              f"{sum(by_kind[:3])}, CLI processes {sum(by_kind[3:])}",
              sorted(won) == ids and len(set(won)) == len(won) and all(by_kind),
              f"duplicates {len(won) - len(set(won))}, missing {len(set(ids) - set(won))}"
              if sorted(won) != ids else "")
    finally:
        stop_server(server)


DRAINER = """
import http.client, json, sys, time
port, token = int(sys.argv[1]), sys.argv[2]
got, quiet_since = [], time.monotonic()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
while time.monotonic() - quiet_since < 2:
    conn.request("POST", "/api/read", body=json.dumps({"limit": 9, "wait": 1}),
                 headers={"Authorization": "Bearer " + token})
    messages = json.loads(conn.getresponse().read())["messages"]
    if messages:
        quiet_since = time.monotonic()
    got += [m["id"] for m in messages]
print(" ".join(map(str, got)))
"""

LOCAL_DRAINER = """
import sys, time
sys.path.insert(0, sys.argv[2])
import agora
store = agora.Store(sys.argv[1])
got, quiet_since = [], time.monotonic()
while time.monotonic() - quiet_since < 2:
    result = agora.call(store, "read", {"limit": 5, "wait": 1}, agora.Caller("inbox", True))
    if result.body["messages"]:
        quiet_since = time.monotonic()
    got += [m["id"] for m in result.body["messages"]]
store.close()
print(" ".join(map(str, got)))
"""


def inbox_drains(work):
    """Readers in several processes drain one inbox while writers post: each message once."""
    db = os.path.join(work, "inbox.db")
    server, port = serve(db)
    try:
        token = mint_token(db, "inbox")
        readers = [subprocess.Popen([sys.executable, "-c", DRAINER, str(port), token],
                                    stdout=subprocess.PIPE, text=True) for _ in range(2)]
        readers += [subprocess.Popen([sys.executable, "-c", LOCAL_DRAINER, db, ROOT],
                                     stdout=subprocess.PIPE, text=True) for _ in range(2)]
        writers = [mint_token(db, f"writer{i}") for i in range(3)]
        sent, lock = [], threading.Lock()

        def write(token):
            for i in range(200):
                status, answer = request(port, "POST", "/api/post",
                                         {"to": "inbox", "body": f"m{i} {token[-6:]}"}, token)
                with lock:
                    sent.append(answer["id"])
        threads = [threading.Thread(target=write, args=(t,)) for t in writers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        got = []
        for reader in readers:
            out, _ = reader.communicate(timeout=120)
            got += [int(x) for x in out.split()]
        check(f"inbox drain: {len(sent)} messages from 3 writers, 4 reader processes "
              "(REST and local)", sorted(got) == sorted(sent),
              f"delivered {len(got)}, distinct {len(set(got))}" if sorted(got) != sorted(sent)
              else "")
    finally:
        stop_server(server)


def kill_nine(work):
    """kill -9 the server under write load: every answered post survives, the file is sound."""
    db = os.path.join(work, "crash.db")
    answered, lock, stop = [], threading.Lock(), threading.Event()
    server, port = serve(db)
    tokens = [mint_token(db, f"w{i}") for i in range(6)]

    def write(token):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        i = 0
        while not stop.is_set():
            i += 1
            try:
                conn.request("POST", "/api/post", body=json.dumps({"body": f"{token[-5:]} {i}"}),
                             headers={"Authorization": f"Bearer {token}"})
                answer = json.loads(conn.getresponse().read())
            except (OSError, ValueError, http.client.HTTPException):
                return
            with lock:
                answered.append(answer["id"])
    threads = [threading.Thread(target=write, args=(t,)) for t in tokens]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    stop.set()
    for thread in threads:
        thread.join()
    con = sqlite3.connect(db)
    present = {row[0] for row in con.execute("SELECT id FROM messages")}
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    lost = [i for i in answered if i not in present]
    check(f"kill -9 under write load: {len(answered)} posts answered, all present after restart",
          not lost and len(answered) > 100, f"{len(lost)} lost" if lost else "")
    check("kill -9: PRAGMA integrity_check is ok", integrity == "ok", integrity)
    server, port = serve(db)
    status, _ = request(port, "POST", "/api/post", {"body": "after the crash"}, tokens[0])
    stop_server(server)
    check("kill -9: the server starts again and takes posts", status == 200, str(status))


NASTY = ["", "\x00", "\ud800", "😀" * 100, "'; DROP TABLE tasks; --", "../../etc/passwd", "a//b",
         None, True, -1, 0, 2 ** 63, 2 ** 64, 1.5, [], {}, "x" * 70000, "NaN", "@", "%_\\"]


def fuzz_http(work, seconds=8.0):
    """Random operations with random hostile arguments over REST and MCP: never a 5xx."""
    db = os.path.join(work, "fuzz.db")
    server, port = serve(db)
    token = mint_token(db, "fuzzer")
    rng = random.Random(7)
    ops = list(agora.CATALOG.values())
    tried, bad = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        op = rng.choice(ops)
        args = {}
        for name, rule in op.schema["properties"].items():
            if rng.random() < 0.6:
                args[name] = rng.choice(NASTY)
        if "wait" in args and args["wait"] not in (None, 0, -1, 2 ** 63, [], {}, "NaN"):
            args["wait"] = 0
        if rng.random() < 0.5:
            status, answer = request(port, "POST", f"/api/{op.name}", args, token)
        else:
            status, answer = request(port, "POST", "/mcp", {
                "jsonrpc": "2.0", "id": tried, "method": "tools/call",
                "params": {"name": op.name, "arguments": args}}, token)
        tried += 1
        if status >= 500:
            bad.append((op.name, str(args)[:80], status))
    log = stop_server(server)
    check(f"fuzz over REST and MCP: {tried} requests, none answered 5xx", not bad, str(bad[:3]))
    check("fuzz: no traceback in the server log", "Traceback" not in log, log[-300:])


def slow_clients(work):
    """Hundreds of idle keep-alive connections and slowloris senders; others served promptly."""
    db = os.path.join(work, "slow.db")
    server, port = serve(db)
    token = mint_token(db, "prompt")
    idle = []
    for _ in range(300):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")   # then stays open
        idle.append(sock)
    slow = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /api/post HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(sock)
    stop = threading.Event()

    def trickle():
        while not stop.is_set():
            for sock in slow:
                try:
                    sock.sendall(b"X")
                except OSError:
                    pass
            stop.wait(0.5)
    trickler = threading.Thread(target=trickle)
    trickler.start()
    latencies = []
    for i in range(100):
        began = time.perf_counter()
        status, _ = request(port, "POST", "/api/post", {"body": f"prompt {i}"}, token, timeout=10)
        latencies.append((time.perf_counter() - began) * 1000)
        assert status == 200
    time.sleep(agora.Server.request_timeout + 1)
    cut = 0
    for sock in slow:
        sock.settimeout(2)
        try:
            if sock.recv(100) == b"":
                cut += 1
        except OSError:
            cut += 1
    stop.set()
    trickler.join()
    for sock in idle + slow:
        sock.close()
    stop_server(server)
    median, worst = statistics.median(latencies), max(latencies)
    check(f"slow clients: with 300 idle and 50 slowloris connections, 100 posts served in "
          f"median {median:.1f} ms (max {worst:.0f} ms)", median < 100 and worst < 2000)
    check(f"slowloris: {cut} of 50 trickling connections cut after the request timeout "
          f"({agora.Server.request_timeout} s)", cut == 50)


def this_machines_address():
    """Answer an address of this machine that is not loopback (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("198.51.100.1", 9))
        return probe.getsockname()[0]


def crowds(work):
    """One address opens 120 connections, each a long-poll of one of three agents: none is
    refused (a waiting one holds no slot of the 64 an address may have served at once),
    past 16 long-polls an agent answers at once, and everyone else is served promptly
    meanwhile."""
    db = os.path.join(work, "crowd.db")
    try:
        address = this_machines_address()
    except OSError as error:            # no route off loopback: nothing to crowd from
        print(f"SKIP crowds: no address but loopback here ({error})", flush=True)
        return
    server, port = serve(db, "--addr", "0.0.0.0:0", "--open", "--allow-host", address,
                         "--allow-host", "127.0.0.1")
    tokens = [mint_token(db, f"waiter{i}") for i in range(3)]
    poster = mint_token(db, "poster")
    sockets, past = [], agora.Server.max_per_address
    for i in range(120):
        sock = socket.create_connection((address, port), timeout=30)
        body = b'{"wait": 8}'
        sock.sendall(f"POST /api/read HTTP/1.1\r\nHost: {address}:{port}\r\nAuthorization: "
                     f"Bearer {tokens[i % 3]}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sockets.append(sock)

    def answer(sock, seconds):
        sock.settimeout(seconds)
        data = b""
        try:
            while not (b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n", 1)[1]) >= int(
                    data.split(b"Content-Length: ", 1)[1].split(b"\r\n")[0])):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (OSError, IndexError, ValueError):
            pass
        return data
    time.sleep(1.5)             # what is refused or capped has answered by now
    import select
    readable = set(select.select(sockets, [], [], 0)[0])
    quick = [answer(sock, 2) if sock in readable else b"" for sock in sockets]
    refused = sum(1 for data in quick if data.startswith(b"HTTP/1.1 503"))
    capped = sum(1 for data in quick if data.startswith(b"HTTP/1.1 200"))    # not waited
    latencies = []
    for i in range(30):
        began = time.perf_counter()
        status, _ = request(port, "POST", "/api/post", {"body": f"news {i}"}, poster)
        latencies.append((time.perf_counter() - began) * 1000)
        assert status == 200, status
    later = [answer(sock, 15) if not data else data for sock, data in zip(sockets, quick)]
    for sock in sockets:
        sock.close()
    log = stop_server(server)
    served = sum(1 for data in later if data.startswith(b"HTTP/1.1 200"))
    check(f"crowds: of 120 long-polls from one address ({past} may be served at once), "
          f"{refused} refused", refused == 0, str(refused))
    check(f"crowds: of 120 long-polls of three agents, {capped} answered at once (past "
          f"{agora.MAX_LONG_POLLS} an agent), the rest woken or timed out",
          capped == 120 - 3 * agora.MAX_LONG_POLLS and served == 120,
          f"{capped} capped, {served} answered 200")
    check(f"crowds: meanwhile 30 posts over loopback in median "
          f"{statistics.median(latencies):.1f} ms (max {max(latencies):.0f} ms)",
          statistics.median(latencies) < 100 and max(latencies) < 2000)
    check("crowds: no traceback in the server log", "Traceback" not in log, log[-300:])


def crowd_of_waiters(work, agents=2000):
    """2,000 agents each hold a read wait=60 on a server started with a soft open-files
    limit of 1,024: none is refused, others' posts stay quick meanwhile, one public post
    reaches every waiter once and promptly, and past the cap the longest wait ends."""
    db = os.path.join(work, "waiters.db")
    server, url = start_server(db, nofile=1024)
    STARTED.append(server)
    port = int(url.rsplit(":", 1)[1])
    tokens = join_many(port, [f"w{i}" for i in range(agents)])
    poster, other = join_many(port, ["poster", "other"])
    crowd = Crowd(port, tokens)
    time.sleep(2)                       # what is refused has been answered by now
    early = crowd.answered()
    latencies = []
    for i in range(30):                 # to an agent who is not waiting: nobody wakes
        began = time.perf_counter()
        status, _ = request(port, "POST", "/api/post", {"to": "other", "body": f"dm {i}"},
                            poster)
        latencies.append((time.perf_counter() - began) * 1000)
        assert status == 200, status
    began = time.monotonic()
    status, posted = request(port, "POST", "/api/post", {"body": "to everyone waiting"}, poster)
    answers = crowd.gather(10, since=began)
    crowd.close()
    exact = [body["messages"] for _, code, body in answers
             if code == 200 and body and [m["id"] for m in body["messages"]] == [posted["id"]]]
    first = answers[0][0] * 1000 if answers else float("inf")
    last = answers[-1][0] if answers else float("inf")
    check(f"waiters: {agents} read wait=60 held (soft limit 1,024), {early} answered or "
          "refused before any news", early == 0, str(early))
    check(f"waiters: meanwhile 30 posts by others all 200, median "
          f"{statistics.median(latencies):.1f} ms (max {max(latencies):.0f} ms)",
          statistics.median(latencies) <= 50, str(latencies))
    check(f"waiters: one public post reached {len(exact)} of {agents} exactly once, the first "
          f"answer in {first:.0f} ms, the last in {last:.2f} s",
          len(exact) == agents == len(answers) and first <= 200 and last <= 2,
          f"{len(answers)} answers, statuses {sorted(set(a[1] for a in answers))}")

    # A waiter that hangs up loses nothing: what comes after goes to its next read.
    kept = 0
    request(port, "POST", "/api/read", {"limit": 200}, other)      # the DMs above: read
    for pause in (0.1, 0.5, 1, 1.5, 2):
        hung = Crowd(port, [other])
        time.sleep(0.3)
        hung.close()
        time.sleep(pause)
        _, sent = request(port, "POST", "/api/post", {"to": "other", "body": f"after {pause}"},
                          poster)
        _, got = request(port, "POST", "/api/read", {"limit": 200}, other)
        kept += sent["id"] in [m["id"] for m in got["messages"]]
    check(f"waiters: hung up 0.1-2 s before a message came, {kept} of 5 got it at the next "
          "read", kept == 5)

    # Past the cap: a server holding at most 100 waits ends the longest first, with 200.
    capped_db = os.path.join(work, "capped.db")
    capped, capped_url = start_server(capped_db, "--max-waiters", "100", nofile=1024)
    STARTED.append(capped)
    port = int(capped_url.rsplit(":", 1)[1])
    tokens = join_many(port, [f"c{i}" for i in range(101)])
    first_crowd = Crowd(port, tokens[:1])
    time.sleep(0.5)
    rest_crowd = Crowd(port, tokens[1:])
    ended = first_crowd.gather(5)
    time.sleep(0.5)
    still = rest_crowd.answered()
    first_crowd.close()
    rest_crowd.close()
    log = stop_server(server) + stop_server(capped)
    check(f"waiters: past a cap of 100, the longest wait was answered {ended[0][1] if ended else '-'}"
          f" 'nothing new' and the other 100 kept waiting ({still} answered)",
          len(ended) == 1 and ended[0][1] == 200 and ended[0][2]["messages"] == [] and still == 0,
          str(ended))
    check("waiters: no traceback in the server logs", "Traceback" not in log, log[-300:])


def threads_of(process):
    """Answer how many threads PROCESS runs now (Linux's /proc)."""
    with open(f"/proc/{process.pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def admission_flood(work, count=600):
    """One agent's token holder leaves COUNT connections idle in the parker (each after a
    long-poll), then sends one byte on each, from loopback and from an address that is not:
    no byte costs a thread or a slot, another agent's post is answered 200 meanwhile, and
    once the requests are whole every one is served, within the bounds."""
    db = os.path.join(work, "flood.db")
    try:
        addresses = ["127.0.0.1", this_machines_address()]
    except OSError:                     # no route off loopback: the loopback half only
        addresses = ["127.0.0.1"]
    extra = [] if len(addresses) == 1 else ["--addr", "0.0.0.0:0", "--open",
                                            "--allow-host", addresses[1]]
    server, port = serve(db, *extra, "--allow-host", "127.0.0.1")
    flood, poster = mint_token(db, "flood"), mint_token(db, "poster")
    body = b'{"wait": 1, "peek": true}'
    for address in addresses:
        head = (f"POST /api/news HTTP/1.1\r\nHost: {address}:{port}\r\nAuthorization: Bearer "
                f"{flood}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        socks = [socket.create_connection((address, port), timeout=30) for _ in range(count)]
        for sock in socks:
            sock.sendall(head)
        answered = sum(sock.recv(65536).startswith(b"HTTP/1.1 200") for sock in socks)
        before = threads_of(server)
        for sock in socks:
            sock.sendall(head[:1])
        time.sleep(1)
        during = threads_of(server)
        status, _ = request(port, "POST", "/api/post", {"body": f"through from {address}"},
                            poster)
        for sock in socks:
            sock.sendall(head[1:])
        served = 0
        for sock in socks:
            sock.settimeout(30)
            served += sock.recv(65536).startswith(b"HTTP/1.1 200")
            sock.close()
        where = "loopback" if address == "127.0.0.1" else "another address"
        check(f"admission flood ({where}): {count} idle parked connections sent a byte each "
              f"-> {during - before:+d} server threads, another agent's post {status}, then "
              f"{served} of {count} whole requests served",
              answered == count and during - before <= 2 and status == 200 and served == count,
              f"{answered} first answers, threads {before} -> {during}")
    log = stop_server(server)
    check("admission flood: no traceback in the server log", "Traceback" not in log, log[-300:])


def failing_log(work):
    """A server whose log cannot be written (stderr on a full disk, or a pipe whose reader
    left, as `agora serve 2>&1 | head` after head is done) answers every waiter of a batch,
    batch after batch: a log line never costs a message."""
    for name, stderr in (("a full disk", "/dev/full"), ("a pipe nobody reads", None)):
        db = os.path.join(work, f"log-{len(name)}.db")
        reader, writer = os.pipe()
        if stderr is None:
            os.close(reader)            # the reader is gone: every write is a broken pipe
            log = writer
        else:
            os.close(reader)
            os.close(writer)
            log = os.open(stderr, os.O_WRONLY)
        server = subprocess.Popen([sys.executable, AGORA, "serve", "--addr", "127.0.0.1:0",
                                   "--db", db], stdout=subprocess.PIPE, stderr=log, text=True)
        os.close(log)
        STARTED.append(server)
        port = int(server.stdout.readline().split(" listening on ")[1].split(" ")[0]
                   .rsplit(":", 1)[1])
        tokens = join_many(port, [f"w{i}" for i in range(4)])
        poster = mint_token(db, "poster")
        got = []
        for batch in range(3):
            crowd = Crowd(port, tokens)
            time.sleep(0.5)
            _, posted = request(port, "POST", "/api/post", {"body": f"batch {batch}"}, poster)
            got += [[m["id"] for m in body["messages"]] == [posted["id"]]
                    for _, code, body in crowd.gather(10) if code == 200 and body]
            crowd.close()
        server.terminate()
        server.communicate(timeout=10)
        check(f"failing log ({name}): 3 batches of 4 waiters, {sum(got)} of 12 got their "
              "message", sum(got) == 12, str(got))


def settle(process, seconds=60):
    """Wait until PROCESS is idle (under 5 % of a core for half a second), at most SECONDS;
    answer how long that took."""
    began = time.monotonic()

    def cpu():
        with open(f"/proc/{process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    while time.monotonic() - began < seconds:
        before = cpu()
        time.sleep(0.5)
        if cpu() - before < 0.025:
            break
    return time.monotonic() - began


def herd(work, agents=10000):
    """Every agent reconnects at once, as after a server restart: AGENTS read wait=60 opened
    together are queued and parked, none refused; one public post then reaches them all."""
    db = os.path.join(work, "herd.db")
    store = agora.Store(db)
    with store.transaction(write=True):         # the agents, in one commit
        tokens = [agora.call(store, "join", {"name": f"h{i}"}).body["token"]
                  for i in range(agents)]
    store.close()
    server, url = start_server(db, nofile=1024)
    STARTED.append(server)
    port = int(url.rsplit(":", 1)[1])
    poster = mint_token(db, "poster")
    began = time.monotonic()
    crowd = Crowd(port, tokens)
    opened = time.monotonic() - began
    settled = settle(server)            # the queue drains into the parker meanwhile
    early = crowd.answered()
    began = time.monotonic()
    status, posted = request(port, "POST", "/api/post", {"body": "to the herd"}, poster)
    answers = crowd.gather(30, since=began)
    crowd.close()
    log = stop_server(server)
    exact = sum(1 for _, code, body in answers
                if code == 200 and body and [m["id"] for m in body["messages"]] == [posted["id"]])
    refused = sum(1 for _, code, _ in answers if code == 503)
    last = answers[-1][0] if answers else float("inf")
    check(f"herd: {agents} read wait=60 opened at once (in {opened:.1f} s, all parked "
          f"{settled:.1f} s later), {early} answered or refused before the post", early == 0,
          str(early))
    check(f"herd: one public post reached {exact} of {agents}, {refused} refused, the last "
          f"in {last:.2f} s", exact == agents and refused == 0,
          f"{len(answers)} answers, statuses {sorted(set(a[1] for a in answers))}")
    check("herd: no traceback in the server log", "Traceback" not in log, log[-300:])


LAYERS, WIDTH = 60, 50      # a plan of 3,000 tasks, each waiting for the whole layer above

PLANNER = """
import http.client, json, sys, time
port, token, first, last = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
worst, turns, deadline = 0.0, 0, time.monotonic() + 5
while time.monotonic() < deadline:      # each a cycle through the whole plan: refused
    began = time.monotonic()
    conn.request("POST", "/api/update_task", body=json.dumps(
        {"id": first, "after": list(range(last - 49, last + 1))}),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    assert response.status in (400, 409), response.status
    worst, turns = max(worst, time.monotonic() - began), turns + 1
print(json.dumps({"worst": worst, "turns": turns}))
"""


def plan_flood(work):
    """An agent loops update_task after= on a layered plan of 3,000 tasks (each a cycle
    through all of it, refused) while another posts: the posts stay quick."""
    db = os.path.join(work, "plan.db")
    server, port = serve(db)
    planner, poster = mint_token(db, "planner"), mint_token(db, "poster")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    layer = []
    for depth in range(LAYERS):
        made = []
        for i in range(WIDTH):
            args = {"title": f"step {depth}.{i}", "after": layer} if layer else {
                "title": f"step {depth}.{i}"}
            conn.request("POST", "/api/post_task", body=json.dumps(args),
                         headers={"Authorization": f"Bearer {planner}"})
            response = conn.getresponse()
            made.append(json.loads(response.read())["id"])
        layer = made
    conn.close()
    first = layer[0] - (LAYERS - 1) * WIDTH
    flooder = subprocess.Popen([sys.executable, "-c", PLANNER, str(port), planner, str(first),
                                str(layer[-1])], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    latencies = posts_meanwhile(port, poster, 4.5)
    report = json.loads(flooder.communicate(timeout=60)[0])
    log = stop_server(server)
    check(f"plan flood: {report['turns']} update_task after= through a plan of "
          f"{LAYERS * WIDTH} tasks, worst {report['worst'] * 1000:.0f} ms; meanwhile "
          f"{len(latencies)} posts in median {statistics.median(latencies):.1f} ms",
          statistics.median(latencies) <= 100, str(report))
    check("plan flood: no traceback in the server log", "Traceback" not in log, log[-300:])


RESERVER = """
import http.client, json, sys, time
port, token, agent = int(sys.argv[1]), sys.argv[2], sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
worst, granted, refused, deadline = 0.0, 0, 0, time.monotonic() + 6
for turn in range(1000):              # five sets of 50: past the cap of 200 a project
    if time.monotonic() > deadline:
        break
    paths = [f"{agent}/r{turn % 5}/p{i}/**/*.py" for i in range(50)]
    began = time.monotonic()
    conn.request("POST", "/api/reserve", body=json.dumps({"paths": paths, "lease": 60}),
                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    worst = max(worst, time.monotonic() - began)
    granted += response.status == 200
    refused += response.status == 400
print(json.dumps({"worst": worst, "granted": granted, "refused": refused}))
"""


def reserve_flood(work):
    """Five agents flood reserves of wildcard patterns up to the cap while another posts."""
    db = os.path.join(work, "reserve.db")
    server, port = serve(db)
    agents = [f"flood{i}" for i in range(5)]
    flooders = [subprocess.Popen([sys.executable, "-c", RESERVER, str(port),
                                  mint_token(db, agent), agent], stdout=subprocess.PIPE,
                                 text=True) for agent in agents]
    poster = mint_token(db, "poster")
    latencies = posts_meanwhile(port, poster, 5)
    reports = [json.loads(flooder.communicate(timeout=60)[0]) for flooder in flooders]
    log = stop_server(server)
    with sqlite3.connect(db) as con:
        most = con.execute("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM "
                           "reservations WHERE expires > ? GROUP BY project, agent)",
                           (int(time.time()),)).fetchone()[0]
    con.close()
    worst = max(report["worst"] for report in reports)
    check(f"reserve flood: {sum(r['granted'] for r in reports)} reserves of 50 patterns by 5 "
          f"agents, worst {worst * 1000:.0f} ms", worst < 2.0, str(reports))
    check(f"reserve flood: meanwhile {len(latencies)} posts in median "
          f"{statistics.median(latencies):.1f} ms (max {max(latencies):.0f} ms)",
          statistics.median(latencies) < 100 and max(latencies) < 2000)
    refused = sum(report["refused"] for report in reports)
    check(f"reserve flood: no agent holds more than {agora.MAX_RESERVATIONS} live reservations "
          f"in a project (most: {most}; {refused} reserves past the cap refused)",
          most == agora.MAX_RESERVATIONS and refused > 0, str(reports))
    check("reserve flood: no traceback in the server log", "Traceback" not in log, log[-300:])


class NoticeReceiver:
    """An ntfy-like receiver on loopback recording (path, notice id, body, when) of each
    POST; HOLD seconds it waits before answering 200 (a slow receiver), and STARTED is set
    when a request arrives."""

    def __init__(self, port=0, hold=0.0):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.got, self.hold, self.started = [], hold, threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.got.append((self.path, self.headers.get("X-Agora-Notice"),
                                     body.decode(), time.monotonic()))
                receiver.started.set()
                time.sleep(receiver.hold)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass                    # its sender is gone (killed mid-send)

            def log_message(self, *args):
                pass
        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def notices_off_the_box(work):
    """People told off the box while things go wrong, on a real server with its defaults
    (but --notify-private: the receiver is on loopback): a receiver that takes 10 s to
    answer slows no post; 1,000 direct messages in a minute are one notice; a server
    killed mid-send sends the notice again after its restart, with the same id."""
    db = os.path.join(work, "notices.db")
    receiver = NoticeReceiver(hold=9.5)
    server, port = serve(db, "--notify-private")
    bob = mint_token(db, "bob")
    for person in ("ann", "flo"):
        subprocess.run([sys.executable, AGORA, "join", f"name={person}", "person=true",
                        "--db", db], check=True, capture_output=True)
        subprocess.run([sys.executable, AGORA, "profile",
                        f"notify=ntfy:http://127.0.0.1:{receiver.port}/{person}", "--as",
                        person, "--db", db], check=True, capture_output=True)
    before = posts_meanwhile(port, bob, 3)
    time.sleep(agora.ON_PAGE + 1)                 # neither is on the page now
    request(port, "POST", "/api/post", {"to": "ann", "body": "first"}, bob)
    flood = time.monotonic()
    for i in range(1000):
        status, _ = request(port, "POST", "/api/post", {"to": "flo", "body": f"dm {i}"}, bob)
        assert status == 200, status
    flooded = time.monotonic() - flood
    receiver.started.wait(agora.NOTIFY_EVERY + 30)
    during = posts_meanwhile(port, bob, 8)        # while a notice waits 9.5 s for its answer
    time.sleep(10)
    check(f"notices: a receiver answering in 9.5 s: {len(during)} posts meanwhile all 200, "
          f"median {statistics.median(during):.1f} ms (before: {statistics.median(before):.1f})",
          statistics.median(during) <= max(2 * statistics.median(before),
                                           statistics.median(before) + 5))
    flo = [got for got in receiver.got if got[0] == "/flo"]
    check(f"notices: 1,000 direct messages to flo in {flooded:.0f} s are one notice",
          len(flo) == 1 and flo[0][2] == "bob: dm 999 (+999 more)",
          [body[:80] for _, _, body, _ in flo])
    receiver.started.clear()
    receiver.hold = 30
    request(port, "POST", "/api/post", {"to": "ann", "body": "through a crash"}, bob)
    receiver.started.wait(agora.NOTIFY_EVERY + 30)
    server.kill()                                 # kill -9 while the notice is being sent
    server.wait()
    cut = receiver.got[-1]
    receiver.hold = 0
    server, port = serve(db, "--notify-private")
    deadline = time.monotonic() + 4 * agora.NOTICE_TIMEOUT
    while len(receiver.got) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    again = receiver.got[3:]
    check("notices: killed mid-send, after the restart the notice came again with its id",
          cut[2] == "bob: through a crash" and len(again) == 1 and again[0][1:3] == cut[1:3],
          (cut[1:3], [got[1:3] for got in again]))
    ids = [int(got[1]) for got in receiver.got if got[0] == "/ann"]
    check("notices: ann's notices in order", ids == sorted(ids), ids)
    log = stop_server(server)
    receiver.close()
    check("notices: no traceback in the server log", "Traceback" not in log, log[-300:])


def receiver_down(work, minutes=10):
    """The receiver down for MINUTES, then back: every notice arrives, once per id, in order.
    The Notifier runs in this process on a real file and a real receiver, its clock moved
    (agora's backoff grows to an hour: ten minutes of real waiting would prove no more)."""
    store = agora.Store(os.path.join(work, "down.db"))
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()                                 # nothing listens there: the receiver is down
    notifier = agora.Notifier(store, "https://agora.example", private=True)
    now = int(time.time())
    agora.call(store, "join", {"name": "ann", "person": True}, now=now)
    agora.call(store, "profile", {"notify": f"ntfy:http://127.0.0.1:{port}/ann"},
               agora.Caller("ann", True), now=now)
    start, receiver, sent = now + agora.ON_PAGE + 1, None, 0
    for clock in range(start, start + 3 * 3600):
        if clock < start + 60 * minutes and (clock - start) % 30 == 0:
            agora.call(store, "post", {"to": "ann", "body": f"dm {sent}"},
                       agora.Caller(f"agent{sent % 3}", True), now=clock)
            sent += 1
        if clock == start + 60 * minutes:
            receiver = NoticeReceiver(port)
        while notifier.step(clock):
            pass
        if receiver and clock > start + 60 * minutes + 3700 and not store.query_one(
                "SELECT count(*) FROM notices WHERE sent IS NULL")[0]:
            break
    made = store.query_one("SELECT count(*) FROM notices")[0]
    ids = [int(got[1]) for got in (receiver.got if receiver else [])]
    told = sum(1 + int(more or 0) for got in (receiver.got if receiver else [])
               for more in re.findall(r"^agent\d: dm \d+(?: \(\+(\d+) more\))?$", got[2], re.M))
    check(f"notices: the receiver down {minutes} min, then back: all {made} notices, telling "
          f"of all {sent} messages, arrived once each, in order",
          ids == list(range(1, made + 1)) and told == sent, (ids, told))
    if receiver:
        receiver.close()
    store.close()


DAY = 86400


def a_year(work, days=365, per_day=(4800, 400, 400)):
    """A team that runs for a year, the clock moved through now: each day ten agents post
    PER_DAY messages (a few direct), finish tasks and revise notes, each reading what came,
    and a prune keeps 30 days. The file stays under twice the size of its busiest 30 days
    (a file that kept those alone), read and brief take as long in December as in
    February, every row pruned is in an archive and each archive checks out, and a prune
    killed with -9 midway leaves every message in the file or an archive."""
    db = os.path.join(work, "year.db")
    store = agora.Store(db)
    agents = [f"a{i}" for i in range(10)]
    messages, tasks, revisions = per_day
    start = 1_767_225_600          # 2026-01-01
    who = {name: agora.Caller(name, True) for name in agents}

    def call(op, name, now, **args):
        return agora.call(store, op, args, who[name], now)

    def size():
        with store.autocommit() as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return os.path.getsize(db)
    for name in agents:
        call("brief", name, start)
    posted = 0
    sizes, timings = {}, {}
    for day in range(days):
        now = start + day * DAY
        with store.transaction(write=True):
            for i in range(messages):
                sender = agents[i % 10]
                to = {"to": agents[(i + 1) % 10]} if i % 20 == 0 else {}
                call("post", sender, now + i, body=f"day {day} message {i} " + "words " * 20, **to)
                posted += 1
            for i in range(tasks):
                task = call("post_task", agents[i % 10], now + i,
                            title=f"day {day} task {i}").body["id"]
                call("claim", agents[(i + 1) % 10], now + i, id=task)
                call("done", agents[(i + 1) % 10], now + i, id=task, result="done")
            for i in range(revisions):
                call("write_note", agents[i % 10], now + i, key=f"notes/{i % 8}",
                     body=f"day {day} revision {i} " + "text " * 30)
        with store.transaction(write=True):
            for name in agents:
                while call("read", name, now + 3600, limit=200).body["messages"]:
                    pass
        if day >= 30:
            while agora.prune(store, 30 * DAY, now + 7200):
                pass
        if day == 29:
            sizes["busiest 30 days"] = size()
        if day % 60 == 30 or day == days - 1:
            took = []
            for name in agents[:3]:
                for op in ("read", "brief"):
                    began = time.perf_counter()
                    call(op, name, now + 7300)
                    took.append(time.perf_counter() - began)
            timings[day] = statistics.median(took) * 1000
    sizes["after a year"] = size()
    archives = sorted(glob_archives(work))
    counts = ("SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM tasks), "
              "(SELECT count(*) FROM note_revisions)")
    archived = [0, 0, 0]
    for path in archives:
        with contextlib.closing(sqlite3.connect(path)) as con:
            archived = [a + b for a, b in zip(archived, con.execute(counts).fetchone())]
    with store.autocommit() as con:
        kept = con.execute(counts).fetchone()
        made = con.execute("SELECT (SELECT seq FROM sqlite_sequence WHERE name = 'messages'), "
                           "(SELECT seq FROM sqlite_sequence WHERE name = 'tasks'), "
                           "(SELECT sum(version) FROM notes)").fetchone()
    store.close()
    checked = [agora._check_file(path) for path in [db] + archives]
    check(f"a year: {posted:,} messages posted over {days} days with --keep 30; the file is "
          f"{sizes['after a year'] / 1048576:.1f} MB after a year, its busiest 30 days alone "
          f"{sizes['busiest 30 days'] / 1048576:.1f} MB (under twice that)",
          sizes["after a year"] < 2 * sizes["busiest 30 days"], sizes)
    first, last = timings[min(timings)], timings[max(timings)]
    check(f"a year: read and brief in median {first:.1f} ms in the second month, "
          f"{last:.1f} ms in the last (flat: under twice)", last < 2 * max(first, 1.0), timings)
    check(f"a year: every message, task and note revision is in the file ({kept[0]:,}, "
          f"{kept[1]:,}, {kept[2]:,}) or an archive ({archived[0]:,}, {archived[1]:,}, "
          f"{archived[2]:,}; {len(archives)} monthly files): {made[0]:,}, {made[1]:,} and "
          f"{made[2]:,} made, the board's own messages included",
          [k + a for k, a in zip(kept, archived)] == list(made), (kept, archived, made))
    check("a year: check is ok on the file and every archive",
          all(line.startswith("ok:") for line in checked), checked[:2])
    killed_midway(work, db)


def glob_archives(folder):
    return [os.path.join(folder, name) for name in os.listdir(folder)
            if re.fullmatch(r"agora-archive-\d{4}-\d{2}\.db", name)]


def killed_midway(work, db):
    """kill -9 a prune that has much to do: afterwards every message is in the file or in
    an archive (never in neither), and the next prune finishes the work."""
    folder = os.path.join(work, "midway")
    os.mkdir(folder)
    copy = os.path.join(folder, "year.db")
    shutil.copy(db, copy)
    prune = subprocess.Popen([sys.executable, AGORA, "prune", "--keep", "1", "--db", copy],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not glob_archives(folder):
        time.sleep(0.01)
    time.sleep(0.2)
    prune.kill()
    prune.communicate()

    def ids(path):
        with contextlib.closing(sqlite3.connect(path)) as con:
            return {row[0] for row in con.execute("SELECT id FROM messages")}
    present = ids(copy)
    archived = set().union(*[ids(path) for path in glob_archives(folder)])
    before = set().union(*[ids(path) for path in glob_archives(work)])  # the year's own
    every = ids(db) | before
    lost = every - present - archived - before
    check(f"a prune killed midway: of {len(every):,} messages {len(present):,} in the file, "
          f"{len(archived):,} archived, none in neither", not lost and present and archived,
          sorted(lost)[:5])
    again = subprocess.run([sys.executable, AGORA, "prune", "--keep", "1", "--db", copy],
                           capture_output=True, text=True, timeout=300)
    checked = subprocess.run([sys.executable, AGORA, "check", "--db", copy],
                             capture_output=True, text=True, timeout=300)
    check("a prune killed midway: the next prune finishes, and check is ok",
          again.returncode == 0 and checked.returncode == 0,
          again.stderr + checked.stderr)


def posts_while_pruning(work, old=60000):
    """A server with --keep 30 starting on a file with OLD messages past the keep (all read)
    prunes them in turns while another agent posts: the posts keep their median, and their
    worst is at most 50 ms more than without the prune (the same file, served plainly)."""
    folder = os.path.join(work, "backlog")       # its archives apart from the year's
    os.mkdir(folder)
    db = os.path.join(folder, "backlog.db")
    store = agora.Store(db)
    now = int(time.time())
    alice = agora.Caller("alice", True)
    for start in range(0, old, 2000):
        with store.transaction(write=True):
            for i in range(start, start + 2000):
                agora.call(store, "post", {"body": f"old {i} " + "words " * 20}, alice,
                           now - 40 * DAY + i)
    agora.call(store, "read", {"limit": 1}, alice, now - 40 * DAY + old)
    with store.transaction(write=True) as con:      # alice has read them all
        con.execute("UPDATE cursors SET last_id = (SELECT max(id) FROM messages)")
    store.close()
    token = mint_token(db, "poster")
    plain, port = serve(db)
    before = posts_meanwhile(port, token, 6)
    stop_server(plain)
    pruning, port = serve(db, "--keep", "30")
    during = posts_meanwhile(port, token, 6)
    log = stop_server(pruning)
    with contextlib.closing(sqlite3.connect(db)) as con:
        left = con.execute("SELECT count(*) FROM messages WHERE ts < ?",
                           (now - 30 * DAY,)).fetchone()[0]
    archived = sum(sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone()[0]
                   for path in glob_archives(folder))
    check(f"posts while pruning: {archived:,} of {old:,} old messages archived meanwhile; "
          f"{len(during)} posts in median {statistics.median(during):.1f} ms, worst "
          f"{max(during):.0f} ms (without the prune: {statistics.median(before):.1f} ms, "
          f"{max(before):.0f} ms)",
          archived > 2000 and statistics.median(during) <= 1.5 * statistics.median(before) + 1
          and max(during) <= max(before) + 50, left)
    check("posts while pruning: no traceback in the server log", "Traceback" not in log,
          log[-300:])


def main():
    """Run every stress check; answer the exit status."""
    work = tempfile.mkdtemp(prefix="agora-stress-")
    began = time.monotonic()
    try:
        for run in (claim_races, inbox_drains, kill_nine, fuzz_http, slow_clients, crowds,
                    crowd_of_waiters, admission_flood, failing_log, herd, plan_flood,
                    reserve_flood, receiver_down, notices_off_the_box, a_year,
                    posts_while_pruning):
            run(work)
    finally:
        for process in STARTED:
            if process.poll() is None:
                process.kill()
                process.communicate()
        shutil.rmtree(work, ignore_errors=True)
    print(f"stress took {time.monotonic() - began:.0f} s")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
