"""What the make interop and make stress scripts share: checks and real servers."""

import json
import os
import subprocess
import sys
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


def start_server(db, *options):
    """Start `agora.py serve` on a free port; answer (process, base URL)."""
    process = subprocess.Popen([sys.executable, AGORA, "serve", "--addr", "127.0.0.1:0",
                                "--db", db, "--quiet", *options], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
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
