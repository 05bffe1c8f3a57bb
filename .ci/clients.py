"""make interop, the coding clients: real Claude Code, Codex and Gemini CLI, end to end.

Each client runs for real against a fake model API on loopback (.ci/fake_model.py)
and a scratch agora database, and each check looks at what reached "the model"
(the recorded requests), not only at exit codes:

- the SessionStart brief is in the first request (claude -p, codex exec, gemini -p);
- a direct message posted before the prompt arrives next to the prompt;
- a message posted mid-turn makes the stop hook continue the turn, once;
- `claude -p` with agora's hooks (their asyncRewake `wake` entries too) ends about
  as fast as without them;
- an idle interactive Claude Code (in a pseudo-terminal) wakes within 2 s for a
  message posted from another process, once per message, and again after its stop;
- MCP round trips over stdio and HTTP: a tool result carrying the message reaches
  the model, and the model's post lands in agora;
- a hook that cannot reach agora is shown to the person (systemMessage).

The clients are found under $AGORA_CLIENTS (default .interop/, as `make interop`
installs them): claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude,
codex/node_modules/@openai/codex-linux-x64/vendor/*/bin/codex and
gemini/node_modules/@google/gemini-cli/bundle/gemini.js (run with the `node` on
PATH). A client that is not installed is one failing check. $AGORA_PY names the
agora.py under test (default the one beside this folder).

Every client run gets a scratch HOME (and CODEX_HOME), an environment with nothing
of the machine's user in it, only loopback addresses, a hard timeout, its own
process group (killed at the end), and a sweep for any process left holding the
run's scratch folder. Standard library only.
"""

import contextlib
import glob
import hashlib
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, check, summary  # noqa: E402
import fake_model  # noqa: E402
from fake_model import FakeModel, request_text, tool, tool_names  # noqa: E402

AGORA = os.path.abspath(os.environ.get("AGORA_PY") or os.path.join(ROOT, "agora.py"))
PYTHON = sys.executable
CLIENTS = os.path.abspath(os.environ.get("AGORA_CLIENTS") or os.path.join(ROOT, ".interop"))
RUN_TIMEOUT = 60            # seconds any one client run may take
UNREACHABLE = "http://127.0.0.1:9"
VERBOSE = bool(os.environ.get("AGORA_CLIENTS_VERBOSE"))


def note(text):
    """Print an indented line of evidence (a fragment, a time) under the checks."""
    print(f"    {text}", flush=True)


def fragment(haystack, needle, width=90):
    """Answer NEEDLE with some of its context in HAYSTACK, on one line (or None)."""
    at = haystack.find(needle)
    if at < 0:
        return None
    start = max(0, at - width)
    return " ".join(haystack[start:at + len(needle) + width // 3].split())


# -- processes ------------------------------------------------------------------

class Run:
    """What a finished client run left: exit status, output, wall time, whether it was
    killed at its timeout."""

    def __init__(self, returncode, stdout, stderr, wall, timed_out):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.wall, self.timed_out = wall, timed_out

    def __repr__(self):
        state = "timed out" if self.timed_out else f"exit {self.returncode}"
        return f"<{state} after {self.wall:.1f}s: {self.stderr[-300:]!r}>"


def kill_group(process):
    """Kill PROCESS's process group (it was started in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def sweep(marker):
    """Kill, by pid, every process of ours whose command line names MARKER (a scratch
    folder unique to one run): hooks a client left behind. Answer the command lines."""
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in argv:
            left.append(argv.strip())
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
    return left


def run(argv, cwd, env, timeout=RUN_TIMEOUT, stdin_text=None):
    """Run ARGV in its own process group with a hard TIMEOUT; answer a Run."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, text=True, start_new_session=True,
                               stdin=subprocess.PIPE if stdin_text is not None
                               else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timed_out = False
    try:
        out, err = process.communicate(stdin_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process)
        out, err = process.communicate()
    finally:
        kill_group(process)
    return Run(process.returncode, out, err, time.monotonic() - started, timed_out)


def agora(db, *args, check_exit=True):
    """Run the agora CLI on DB; answer its stdout."""
    done = subprocess.run([PYTHON, AGORA, *args, "--db", db], capture_output=True,
                          text=True, timeout=30)
    if check_exit and done.returncode != 0:
        raise RuntimeError(f"agora {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def dm(db, to, body, sender="bob"):
    """Post BODY to agent TO as SENDER (both are created when missing)."""
    agora(db, "brief", "--as", to)
    return agora(db, "post", f"body={body}", f"to={to}", "--as", sender)


def public_history(db):
    """Answer the messages of #public, newest last, via agora's own CLI."""
    out = agora(db, "history", "channel=public", "--as", "x", "--json")
    body = json.loads(out)
    return body.get("messages", body) if isinstance(body, dict) else body


class AgoraServer:
    """`agora.py serve` on a free loopback port, for the HTTP faces (MCP over HTTP)."""

    def __init__(self, db):
        self.process = subprocess.Popen([PYTHON, AGORA, "serve", "--addr", "127.0.0.1:0",
                                         "--db", db, "--quiet"], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        line = self.process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            kill_group(self.process)
            raise RuntimeError(f"agora serve said {line!r}")
        self.url = match.group(1)

    def close(self):
        kill_group(self.process)
        self.process.communicate()


def mint(db, name):
    """Mint NAME's bearer token the operator's way."""
    return json.loads(agora(db, "join", f"name={name}", "--json"))["token"]


# -- a scratch world per run ------------------------------------------------------

class Scratch:
    """One run's folders: HOME, a project and the agora database, all under one
    temporary folder that nothing else uses (its path is the sweep marker)."""

    def __init__(self, base, label):
        self.root = tempfile.mkdtemp(prefix=f"{label}-", dir=base)
        self.home = os.path.join(self.root, "home")
        self.project = os.path.join(self.root, "project")
        self.db = os.path.join(self.root, "agora.db")
        for folder in (self.home, self.project):
            os.makedirs(folder)

    def write(self, relative, content, under=None):
        """Write CONTENT (str, or JSON for anything else) at RELATIVE under HOME
        (or UNDER); answer the path."""
        path = os.path.join(under or self.home, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content if isinstance(content, str) else json.dumps(content, indent=2))
        return path

    def sweep(self):
        return sweep(self.root)


def base_env(scratch):
    """The environment every client starts from: nothing of the machine's user."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch.home,
           "TERM": "xterm-256color", "LANG": "C.UTF-8", "TMPDIR": scratch.root,
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return env


# -- the hook files -------------------------------------------------------------

def hook_argv(event, client, name, db, url=None):
    """Answer the argv of one agora hook: --as NAME on DB, or --url URL."""
    who = ["--url", url] if url else ["--as", name, "--db", db]
    return [PYTHON, AGORA, "hook", event, "--client", client, *who]


def write_hooks(client, scratch, name, url=None, wake=True, command=None):
    """Write CLIENT's hook file in SCRATCH's project, in the shape README.md shows, for
    agent NAME on the scratch database (or --url URL). COMMAND (a function of the
    event) replaces agora's hook, to learn how a client shows a hook's output.

    This is the one step that writes hook files: when `agora.py hook install
    claude|codex|gemini|cursor` exists for every client it can do this instead.
    Answer the file's path.
    """
    def shell(event):
        return command(event) if command else shlex.join(hook_argv(event, client, name,
                                                                   scratch.db, url))
    if client == "claude":
        def entry(event, **extra):
            if command:
                return dict({"type": "command", "command": command(event)}, **extra)
            argv = hook_argv(event, client, name, scratch.db, url)
            argv.remove("--client"), argv.remove("claude")
            return dict({"type": "command", "command": argv[0], "args": argv[1:]}, **extra)
        waker = [entry("wake", asyncRewake=True, timeout=86400 + 60)] if wake else []
        hooks = {"SessionStart": [{"hooks": [entry("session-start", timeout=30)] + waker}],
                 "UserPromptSubmit": [{"hooks": [entry("prompt", timeout=30)]}],
                 "Stop": [{"hooks": [entry("stop", timeout=30)] + waker}]}
        return scratch.write(".claude/settings.local.json", {"hooks": hooks},
                             under=scratch.project)
    if client == "codex":
        hooks = {event: [{"hooks": [{"type": "command", "timeout": 30,
                                     "command": shell(word)}]}]
                 for event, word in (("SessionStart", "session-start"),
                                     ("UserPromptSubmit", "prompt"), ("Stop", "stop"))}
        return scratch.write(".codex/hooks.json", {"hooks": hooks}, under=scratch.project)
    if client == "gemini":
        hooks = {event: [{"hooks": [{"type": "command", "timeout": 30000,
                                     "command": shell(word)}]}]
                 for event, word in (("SessionStart", "session-start"),
                                     ("BeforeAgent", "prompt"), ("AfterAgent", "stop"))}
        path = os.path.join(scratch.project, ".gemini", "settings.json")
        settings = json.load(open(path)) if os.path.exists(path) else {}
        settings["hooks"] = hooks
        return scratch.write(".gemini/settings.json", settings, under=scratch.project)
    raise ValueError(client)


# -- the clients ------------------------------------------------------------------

class Client:
    """What every driver has: a name, where its program is, whether it is there."""

    name = "?"

    def program(self):
        raise NotImplementedError

    def available(self):
        return all(os.path.exists(part) for part in self.program()[-1:])

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=()):
        """Run one prompt without a person; answer a Run."""
        raise NotImplementedError


class ClaudeCode(Client):
    """Claude Code 2.1.332: ANTHROPIC_BASE_URL at the fake model, an API key it was
    told to accept, onboarding and the project's trust dialog marked done in
    $HOME/.claude.json, no nonessential traffic."""

    name = "claude"
    version = "2.1.332"

    def program(self):
        return [os.path.join(CLIENTS, "claude", "node_modules", "@anthropic-ai",
                             "claude-code-linux-x64", "claude")]

    def env(self, scratch, model):
        return dict(base_env(scratch), ANTHROPIC_BASE_URL=model.url,
                    ANTHROPIC_API_KEY="sk-ant-test", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                    DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1")

    def prepare(self, scratch, model):
        """Pre-seed $HOME/.claude.json so neither onboarding nor a trust dialog shows."""
        path = os.path.join(scratch.home, ".claude.json")
        config = json.load(open(path)) if os.path.exists(path) else {}
        config.update({"hasCompletedOnboarding": True, "lastOnboardingVersion": self.version,
                       "customApiKeyResponses": {"approved": ["sk-ant-test"], "rejected": []},
                       "autoUpdates": False})
        config.setdefault("projects", {}).setdefault(scratch.project, {}).update(
            {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True})
        scratch.write(".claude.json", config)

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=()):
        self.prepare(scratch, model)
        return run(self.program() + ["-p", prompt, "--output-format", "stream-json",
                                     "--verbose", *extra],
                   scratch.project, self.env(scratch, model), timeout)

    def mcp_add(self, scratch, model, *args):
        """`claude mcp add ...` in the project, with the run's HOME; answer the Run."""
        self.prepare(scratch, model)
        return run(self.program() + ["mcp", "add", *args], scratch.project,
                   self.env(scratch, model), 30)


class Codex(Client):
    """Codex CLI 0.171.0: a model provider "fake" at the fake model in
    $CODEX_HOME/config.toml, plugins off, the project trusted there, and every hook
    in the project's .codex/hooks.json trusted by the hash Codex computes."""

    name = "codex"

    def program(self):
        found = sorted(glob.glob(os.path.join(CLIENTS, "codex", "node_modules", "@openai",
                                              "codex-linux-*", "vendor", "*", "bin", "codex")))
        return found[:1] or [os.path.join(CLIENTS, "codex", "missing-codex")]

    def env(self, scratch, model):
        return dict(base_env(scratch), CODEX_HOME=os.path.join(scratch.home, ".codex"),
                    FAKE_API_KEY="sk-test")

    def config(self, scratch, model, mcp=None):
        """Write $CODEX_HOME/config.toml: provider, trust, hook trust, MCP servers."""
        lines = ['model_provider = "fake"', 'model = "gpt-fake"',
                 'check_for_update_on_startup = false', "",
                 "[model_providers.fake]", 'name = "fake"',
                 f"base_url = {json.dumps(model.url + '/v1')}", 'env_key = "FAKE_API_KEY"',
                 'wire_api = "responses"', "", "[features]", "plugins = false", "",
                 "[analytics]", "enabled = false", "",
                 f"[projects.{json.dumps(scratch.project)}]", 'trust_level = "trusted"', ""]
        for key, digest in codex_hook_trust(scratch.project).items():
            lines += [f"[hooks.state.{json.dumps(key)}]", f"trusted_hash = {json.dumps(digest)}",
                      ""]
        for name, server in (mcp or {}).items():
            lines.append(f"[mcp_servers.{name}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in server.items()]
            lines.append("")
        scratch.write(".codex/config.toml", "\n".join(lines))

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None):
        self.config(scratch, model, mcp)
        return run(self.program() + ["exec", "--skip-git-repo-check", "--color", "never",
                                     *extra, prompt],
                   scratch.project, self.env(scratch, model), timeout)


CODEX_EVENT_LABELS = {"PreToolUse": "pre_tool_use", "PermissionRequest": "permission_request",
                      "PostToolUse": "post_tool_use", "PreCompact": "pre_compact",
                      "PostCompact": "post_compact", "SessionStart": "session_start",
                      "SessionEnd": "session_end", "UserPromptSubmit": "user_prompt_submit",
                      "SubagentStart": "subagent_start", "SubagentStop": "subagent_stop",
                      "Stop": "stop"}


def codex_hook_trust(project):
    """Answer {state key: trusted_hash} for every command hook in PROJECT/.codex/hooks.json,
    as Codex computes them (codex-rs/hooks/src/engine/discovery.rs, command_hook_hash):
    sha256 of the sorted-key compact JSON of the event's label plus the matcher group
    holding only the normalised handler (timeout defaulted to 600, async a bool, unset
    fields left out; no matcher for UserPromptSubmit and Stop). The key is
    "<absolute hooks.json>:<label>:<group>:<handler>". What the TUI's "Trust" writes."""
    path = os.path.join(project, ".codex", "hooks.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        events = json.load(f).get("hooks", {})
    trust = {}
    for event, groups in events.items():
        label = CODEX_EVENT_LABELS.get(event)
        for group_index, group in enumerate(groups if label else []):
            for handler_index, handler in enumerate(group.get("hooks", [])):
                if handler.get("type") != "command":
                    continue
                normal = {"type": "command", "command": handler["command"],
                          "timeout": max(1, handler.get("timeout", handler.get("timeoutSec",
                                                                                600))),
                          "async": bool(handler.get("async", False))}
                if handler.get("statusMessage") is not None:
                    normal["statusMessage"] = handler["statusMessage"]
                identity = {"event_name": label, "hooks": [normal]}
                if group.get("matcher") is not None and event not in ("UserPromptSubmit",
                                                                       "Stop"):
                    identity["matcher"] = group["matcher"]
                digest = hashlib.sha256(json.dumps(identity, sort_keys=True,
                                                   separators=(",", ":")).encode()).hexdigest()
                trust[f"{path}:{label}:{group_index}:{handler_index}"] = f"sha256:{digest}"
    return trust


class Gemini(Client):
    """Gemini CLI 0.61.0: GOOGLE_GEMINI_BASE_URL at the fake model, an API key and
    security.auth.selectedType "gemini-api-key" in the user settings, the project in
    ~/.gemini/trustedFolders.json, telemetry and update checks off."""

    name = "gemini"

    def program(self):
        return ["node", os.path.join(CLIENTS, "gemini", "node_modules", "@google",
                                     "gemini-cli", "bundle", "gemini.js")]

    def env(self, scratch, model):
        return dict(base_env(scratch), GOOGLE_GEMINI_BASE_URL=model.url,
                    GEMINI_API_KEY="fake-key", GEMINI_CLI_NO_RELAUNCH="true")

    def prepare(self, scratch, model, mcp=None):
        settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}}
        if mcp:
            settings["mcpServers"] = mcp
        scratch.write(".gemini/settings.json", settings)
        scratch.write(".gemini/trustedFolders.json", {scratch.project: "TRUST_FOLDER"})

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None):
        self.prepare(scratch, model, mcp)
        return run(self.program() + ["-p", prompt, *extra], scratch.project,
                   self.env(scratch, model), timeout)
