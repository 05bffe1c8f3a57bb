"""make faults: agora's file under real storage faults, the way SQLite itself is tested.

A real server runs with four agents posting, claiming, writing notes and reading,
while a fault comes and goes: the disk fills (a small tmpfs; a loop-mounted ext4
with 1 KiB and with 4 KiB blocks), libfiu fails fdatasync, pwrite, pread or open in
the running process, or its descriptors run out (prlimit). Each phase checks that
it saw its fault happen, that every refusal was a clear JSON answer, that writes
resumed by themselves once the fault was gone, that every write answered 200 is
there while the server runs and after kill -9 and a restart, that `check` passes,
and that nothing reached the log as a bug. Mounting needs root; libfiu needs
Debian's fiu-utils. Standard library only; the run ends with 'N passed, N failed'.
"""

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGORA, check, mint_token, start_server, stop_server,  # noqa: E402
                     summary)

STARTED = []            # every server process, so that none outlives a phase that stopped
MOUNTED = []            # every mount point, so that none outlives the run
AGENTS = 4
BEFORE, DURING, AFTER = 1.0, 2.5, 2.0       # seconds of work around each fault


def call(conn, token, op, args):
    """One operation over a kept connection; answer (status, body): a status of 0 with
    the cause when the connection failed or the answer was not JSON."""
    try:
        conn.request("POST", f"/api/{op}", body=json.dumps(args),
                     headers={"Authorization": f"Bearer {token}",
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as error:
        conn.close()
        return 0, {"error": f"no answer: {error!r}"}
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return 0, {"error": f"not JSON: {raw[:200]!r}"}


class Work:
    """AGENTS threads, each one agent, doing a post, a task posted and claimed, a note,
    a read and a look at history (a read on a connection of its own, whose cache each
    write empties) in turn until stopped; what each was answered is kept."""

    def __init__(self, port, tokens, task_words=300):
        self.port, self.tokens, self.task_words = port, tokens, task_words
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers = []           # (monotonic time, agent, op, status, body, what)
        self.threads = [threading.Thread(target=self._agent, args=(name, token))
                        for name, token in tokens.items()]

    def start(self):
        """Start the agents."""
        for thread in self.threads:
            thread.start()
        return self

    def finish(self):
        """Stop the agents; answer their answers."""
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        return self.answers

    def _agent(self, name, token):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        turn = 0
        while not self.stop.is_set():
            turn += 1
            body = f"{name} says {turn} " + "x" * 300
            self._keep(name, "post", *call(conn, token, "post", {"body": body}), body)
            title = f"{name} task {turn}"
            status, answer = call(conn, token, "post_task", {"title": title, "body":
                                                             f"s{turn} " * self.task_words})
            self._keep(name, "post_task", status, answer, title)
            if status == 200:
                self._keep(name, "claim", *call(conn, token, "claim", {"id": answer["id"]}),
                           answer["id"])
            key = f"{name}-{turn}"
            self._keep(name, "write_note", *call(conn, token, "write_note",
                                                 {"key": key, "body": "z" * 500}), key)
            self._keep(name, "read", *call(conn, token, "read", {"limit": 50}), None)
            self._keep(name, "history", *call(conn, token, "history", {"channel": "public"}),
                       None)

    def _keep(self, name, op, status, body, what):
        with self.lock:
            self.answers.append((time.monotonic(), name, op, status, body, what))


def saved(port, tokens, answers):
    """Answer what the server holds of the work in ANSWERS: ({post bodies}, {task ids
    each agent holds}, {note keys}), read through its own API."""
    keys = answered_writes(answers)[2]
    name, token = next(iter(tokens.items()))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    bodies, before = set(), 0
    while True:
        status, page = call(conn, token, "history", {"channel": "public", "limit": 200,
                                                     "before": before})
        assert status == 200, page
        bodies |= {m["body"] for m in page["messages"]}
        if not page["more"]:
            break
        before = page["messages"][0]["id"]
    held = set()
    for name, task_id in answered_writes(answers)[1]:
        status, task = call(conn, token, "task", {"id": task_id})
        if status == 200 and task["task"]["owner"] == name:
            held.add((name, task_id))
    keys = {key for key in keys if call(conn, token, "read_note", {"key": key})[0] == 200}
    conn.close()
    return bodies, held, keys


def wind_down(work, server, port, tokens):
    """Stop the agents, read what the server holds, then kill -9 it; answer (answers,
    what it held, whether it was up, its log)."""
    answers = work.finish()
    alive = server.poll() is None
    held = saved(port, tokens, answers) if alive else (set(), set(), set())
    return answers, held, alive, crash(server)


def answered_writes(answers):
    """Answer the writes answered 200: ({post bodies}, {(agent, claimed id)}, {keys})."""
    ok = [(name, op, what) for _, name, op, status, _, what in answers if status == 200]
    return ({what for _, op, what in ok if op == "post"},
            {(name, what) for name, op, what in ok if op == "claim"},
            {what for _, op, what in ok if op == "write_note"})


def missing(answers, held):
    """Answer, per kind, how many writes answered 200 are not in HELD (from saved)."""
    return {kind: len(want - have) for kind, want, have in
            zip(("posts", "claims", "notes"), answered_writes(answers), held)}


def judge(phase, answers, fault_began, fault_ended, log, alive, held, told, tokens, db,
          restart):
    """Check one phase's promises; TOLD is what a refusal in the window must say."""
    refused = [(status, body) for moment, _, _, status, body, _ in answers if status != 200]
    in_window = [(status, body) for moment, _, _, status, body, _ in answers
                 if status != 200 and fault_began <= moment <= fault_ended + 0.5]
    after = [status for moment, _, op, status, _, _ in answers
             if moment > fault_ended + 0.5 and op not in ("read", "history")]
    writes = sum(1 for *_, op, status, _, _ in answers if op not in ("read", "history"))
    check(f"{phase}: the fault was felt ({len(in_window)} refused in the window, of "
          f"{writes} writes and {len(answers) - writes} reads)", in_window,
          "no refusal while the fault lasted")
    unclear = [(status, body) for status, body in refused
               if status < 400 or not isinstance(body.get("error"), str)
               or status not in (409, 500, 503)]
    check(f"{phase}: every refusal was a clear JSON answer ({len(refused)})", not unclear,
          str(unclear[:3]))
    strange = [body["error"] for status, body in in_window if status >= 500
               and not any(words in body["error"] for words in told)]
    check(f"{phase}: each refusal named the cause ({', '.join(sorted(set(told)))})",
          not strange, str(strange[:3]))
    damaged = [body["error"] for status, body in refused
               if "damaged" in body["error"] or "malformed" in body["error"]
               or "savepoint" in body["error"]]
    check(f"{phase}: nothing was called damaged, no savepoint named", not damaged,
          str(damaged[:3]))
    check(f"{phase}: writes resumed by themselves ({after.count(200)} of {len(after)} after "
          f"the fault answered 200)", after and all(status == 200 for status in after),
          str(after[:20]))
    check(f"{phase}: the server stayed up", alive)
    live = missing(answers, held)
    check(f"{phase}: every write answered 200 is there live ({live})",
          not any(live.values()))
    server, port = restart()
    later = missing(answers, saved(port, tokens, answers))
    log += stop_server(server)
    check(f"{phase}: and after kill -9 and a restart ({later})", not any(later.values()))
    done = subprocess.run([sys.executable, AGORA, "check", "--db", db], capture_output=True,
                          text=True, timeout=120)
    check(f"{phase}: check passes", done.returncode == 0, done.stdout + done.stderr)
    check(f"{phase}: no bug in the server log", "Traceback" not in log
          and "a bug in" not in log, log[-600:])


def serve(db, prefix=()):
    """Start a server on DB (under PREFIX, e.g. fiu-run); answer (process, port)."""
    process, url = start_server(db, prefix=prefix)
    STARTED.append(process)
    return process, int(url.rsplit(":", 1)[1])


def crash(process):
    """kill -9 a server: answer what it wrote on stderr."""
    if process.poll() is None:
        process.kill()
    return process.communicate(timeout=30)[1]


def agents(db):
    """Mint the working agents' tokens on DB."""
    return {f"agent{i}": mint_token(db, f"agent{i}") for i in range(AGENTS)}


def fill(folder):
    """Fill the disk holding FOLDER: in large bites, then (what a filesystem keeps back
    for the last small files) in small ones."""
    for name, bite in (("filler", 65536), ("crumbs", 1024)):
        try:
            with open(os.path.join(folder, name), "wb") as f:
                while True:
                    f.write(b"\xff" * bite)
                    f.flush()
                    os.fsync(f.fileno())
        except OSError:
            pass


def unfill(folder):
    """Give back the space fill took."""
    for name in ("filler", "crumbs"):
        with_path = os.path.join(folder, name)
        if os.path.exists(with_path):
            os.remove(with_path)


def mount(work, kind):
    """Mount a small disk of KIND (tmpfs, ext4-1k, ext4-4k) under WORK; answer its folder."""
    folder = os.path.join(work, kind)
    os.mkdir(folder)
    if kind == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", folder],
                       check=True)
    else:
        image = os.path.join(work, f"{kind}.img")
        with open(image, "wb") as f:
            f.truncate(24 * 1024 * 1024)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b",
                        {"ext4-1k": "1024", "ext4-4k": "4096"}[kind], image], check=True)
        subprocess.run(["mount", "-o", "loop", image, folder], check=True)
    MOUNTED.append(folder)
    return folder


def unmount(folder):
    """Unmount FOLDER (and so free its loop device)."""
    subprocess.run(["umount", folder], check=True)
    MOUNTED.remove(folder)


def disk_fills(work, kind):
    """The disk fills under a running server, then space comes back; then the file at
    rest on a full disk: check, the CLI and serve name the cause, none is killed."""
    phase = f"full disk ({kind})"
    if os.geteuid() != 0:
        print(f"SKIP {phase}: mounting needs root", flush=True)
        return
    folder = mount(work, kind)
    try:
        db = os.path.join(folder, "agora.db")
        tokens = agents(db)
        server, port = serve(db)
        shm = os.stat(db + "-shm")
        if kind == "ext4-1k":       # SQLite alone leaves 3 KiB of each 4 KiB page a hole
            check(f"{phase}: the -shm is allocated ahead as the server starts, no hole "
                  f"for SIGBUS ({shm.st_blocks * 512} bytes for {shm.st_size})",
                  shm.st_blocks * 512 >= shm.st_size >= 4 * 32768)
        work_ = Work(port, tokens).start()
        try:
            time.sleep(BEFORE)
            began = time.monotonic()
            fill(folder)
            time.sleep(DURING)
            unfill(folder)
            ended = time.monotonic()
            time.sleep(AFTER)
        finally:
            answers, held, alive, log = wind_down(work_, server, port, tokens)
        judge(phase, answers, began, ended, log, alive, held,
              ("no space left", "disk is full"), tokens, db, lambda: serve(db))
        at_rest(phase, folder, db)
    finally:
        for process in STARTED:
            if process.poll() is None:
                process.kill()
                process.communicate()
        unfill(folder)
        unmount(folder)


def at_rest(phase, folder, db):
    """The file at rest on a full disk: check, read and serve say so, exit 1, and are not
    killed (a sparse -shm mapped on a full disk is SIGBUS); then check is ok again."""
    fill(folder)
    said = {}
    for name, argv in (("check", ["check"]), ("read", ["read", "--as", "agent0"]),
                       ("serve", ["serve", "--addr", "127.0.0.1:0"])):
        done = subprocess.run([sys.executable, AGORA, *argv, "--db", db],
                              capture_output=True, text=True, timeout=30)
        said[name] = (done.returncode, done.stderr.strip()[-300:])
    unfill(folder)
    fine = subprocess.run([sys.executable, AGORA, "check", "--db", db],
                          capture_output=True, text=True, timeout=60)
    check(f"{phase}: at rest, check, read and serve exit 1 saying 'no space left' (none "
          f"killed by a signal), and call nothing damaged",
          all(code == 1 and "no space left on the disk" in text and "damaged" not in text
              for code, text in said.values()), str(said))
    check(f"{phase}: once space is freed, check says ok",
          fine.returncode == 0 and fine.stdout.startswith("ok:"), fine.stdout + fine.stderr)


def io_fails(work, call_name, told, probability=0.2):
    """libfiu fails CALL_NAME in the running server, one call in five, for a while."""
    phase = f"failing {call_name.rsplit('/', 1)[1]}"
    if not shutil.which("fiu-run"):
        print(f"SKIP {phase}: no fiu-run here (Debian's fiu-utils)", flush=True)
        return
    db = os.path.join(work, f"{phase.replace(' ', '-')}.db")
    tokens = agents(db)
    control = os.path.join(work, "fiu")
    server, port = serve(db, ("fiu-run", "-x", "-f", control))
    work_ = Work(port, tokens).start()
    time.sleep(BEFORE)
    began = time.monotonic()
    subprocess.run(["fiu-ctrl", "-f", control, "-c",
                    f"enable_random name={call_name},probability={probability}",
                    str(server.pid)], check=True)
    time.sleep(DURING)
    subprocess.run(["fiu-ctrl", "-f", control, "-c", f"disable name={call_name}",
                    str(server.pid)], check=True)
    ended = time.monotonic()
    time.sleep(AFTER)
    answers, held, alive, log = wind_down(work_, server, port, tokens)
    judge(phase, answers, began, ended, log, alive, held, told, tokens, db, lambda: serve(db))


def lowest_free_descriptor(pid):
    """Answer the lowest descriptor number process PID has free: the next it would open."""
    open_now = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return min(set(range(len(open_now) + 1)) - open_now)


def descriptors_run_out(work):
    """prlimit takes a running server's descriptors down to what it has open, for a
    while: the writer survives, writes are refused by name, then served again."""
    phase = "no descriptors"
    db = os.path.join(work, "descriptors.db")
    tokens = agents(db)
    server, port = serve(db)
    work_ = Work(port, tokens, task_words=2300).start()   # FTS5 spills these to a file
    time.sleep(BEFORE)
    began = time.monotonic()
    # the lowest number free, at the quietest of a few looks: a descriptor open for an
    # instant (a connection, a spill file) would leave one number free below the limit
    looks = []
    for _ in range(20):
        looks.append(lowest_free_descriptor(server.pid))
        time.sleep(0.01)
    lowest_free = min(looks)
    subprocess.run(["prlimit", f"--pid={server.pid}", f"--nofile={lowest_free}:"], check=True)
    time.sleep(DURING)
    subprocess.run(["prlimit", f"--pid={server.pid}", "--nofile=4096:"], check=True)
    ended = time.monotonic()
    time.sleep(AFTER)
    answers, held, alive, log = wind_down(work_, server, port, tokens)
    # a descriptor freed a moment later can hide the cause: then the hint names the limit
    judge(phase, answers, began, ended, log, alive, held,
          ("too many open files", "could not be opened"), tokens, db, lambda: serve(db))


def unknown_after_failed_sync(work):
    """fdatasync fails in a running server, three times in ten: every post answered 200
    is there after kill -9 and a restart, and none that failed in the sync is told
    'not saved' (SQLite cannot say whether it reached the disk)."""
    if not shutil.which("fiu-run"):
        print("SKIP failed syncs: no fiu-run here (Debian's fiu-utils)", flush=True)
        return
    db = os.path.join(work, "syncs.db")
    token = mint_token(db, "writer")
    server, port = serve(db, ("fiu-run", "-x", "-f", "", "-c",
                              "enable_random name=posix/io/sync/fdatasync,probability=0.3"))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    answers = [call(conn, token, "post", {"body": f"sync {i}"}) for i in range(40)]
    log = crash(server)
    ids = [body["id"] for status, body in answers if status == 200]
    failed = [body["error"] for status, body in answers if status != 200]
    server, port = serve(db)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    _, history = call(conn, token, "history", {"channel": "public", "limit": 200})
    stop_server(server)
    kept = {m["id"] for m in history["messages"]}
    check(f"crash after failed syncs: {len(ids)} posts answered 200 are all there after "
          f"kill -9 and a restart; {len(failed)} failed", failed and set(ids) <= kept,
          f"{len(failed)} failed, missing {sorted(set(ids) - kept)[:5]}")
    check("crash after failed syncs: each failed post says it may or may not have been "
          "saved, none 'not saved'", failed and all("may or may not have been saved" in e
                                                    for e in failed), str(failed[:3]))
    check("crash after failed syncs: no bug in the server log", "Traceback" not in log,
          log[-300:])


def main():
    """Run every phase; answer the exit status."""
    work = tempfile.mkdtemp(prefix="agora-faults-")
    began = time.monotonic()
    phases = [("tmpfs", lambda: disk_fills(work, "tmpfs")),
              ("ext4-1k", lambda: disk_fills(work, "ext4-1k")),
              ("ext4-4k", lambda: disk_fills(work, "ext4-4k")),
              ("fdatasync", lambda: io_fails(work, "posix/io/sync/fdatasync",
                                             ("may or may not have been saved",))),
              ("pwrite", lambda: io_fails(work, "posix/io/rw/pwrite",      # errno EIO or ENOSPC
                                          ("could not be read or written", "disk is full",
                                           "may or may not have been saved"))),
              ("pread", lambda: io_fails(work, "posix/io/rw/pread",
                                         ("could not be read",))),
              ("open", lambda: io_fails(work, "posix/io/oc/open",
                                        ("could not be opened", "could not be read or written"))),
              ("descriptors", lambda: descriptors_run_out(work)),
              ("failed syncs", lambda: unknown_after_failed_sync(work))]
    wanted = set(sys.argv[1:])
    try:
        for name, phase in phases:
            if not wanted or name in wanted:
                phase()
    finally:
        for process in STARTED:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.communicate()
        for folder in list(MOUNTED):
            subprocess.run(["umount", "-l", folder])
        shutil.rmtree(work, ignore_errors=True)
    print(f"faults took {time.monotonic() - began:.0f} s")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
