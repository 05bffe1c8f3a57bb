"""make interop: drive a real agora server with real third-party MCP clients.

Runs inside the throwaway virtual environment that `make interop` builds (it has
the official Python SDK, `mcp`); the MCP Inspector CLI and the conformance suite
come from the Node folder beside it. Every check prints one line; the run ends
with 'N passed, N failed' and exits non-zero when anything failed.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import agora  # noqa: E402  (the server under test, standard library only)

AGORA = os.path.join(ROOT, "agora.py")
NPM_BIN = os.path.join(ROOT, ".interop", "npm", "node_modules", ".bin")
TOOLS = list(agora.CATALOG)
CONFORMANCE_SCENARIOS = ["server-initialize", "ping", "tools-list", "dns-rebinding-protection"]

results = []


def check(name, ok, detail=""):
    """Record one check and print its line."""
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""),
          flush=True)


def start_server(db):
    """Start `agora.py serve` on a free port; answer (process, base URL)."""
    process = subprocess.Popen([sys.executable, AGORA, "serve", "--addr", "127.0.0.1:0",
                                "--db", db, "--quiet"], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    url = line.split(" listening on ")[1].split(" ")[0]
    return process, url


def mint_token(db, name):
    """Mint NAME's token the operator's way: `agora.py join` on the server's file."""
    out = subprocess.run([sys.executable, AGORA, "join", f"name={name}", "--json", "--db", db],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["token"]


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


def main():
    """Run every interop check; answer the exit status."""
    workdir = tempfile.mkdtemp(prefix="agora-interop-")
    db = os.path.join(workdir, "agora.db")
    home = os.path.join(workdir, "home")
    os.makedirs(home)
    server, url = start_server(db)
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
        store = agora.Store(db)
        seen = agora.call(store, "history", {"channel": "public", "limit": 50},
                          agora.Caller("auditor", True)).body["messages"]
        store.close()
        senders = {message["sender"] for message in seen}
        check("every client's post landed in the one file",
              {"sdk", "stdio-agent", "inspector"} <= senders, senders)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
