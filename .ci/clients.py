"""make interop, the coding clients: real Claude Code, Codex, Gemini CLI, Qwen Code,
GitHub Copilot CLI and OpenCode, end to end.

Each client runs for real against a fake model API on loopback (.ci/fake_model.py)
and a scratch agora database, and each check looks at what reached "the model"
(the recorded requests), not only at exit codes:

- the SessionStart brief is in the first request (claude -p, codex exec, gemini -p);
- a direct message that arrives after the brief is next to the prompt;
- a message posted mid-turn makes the stop hook continue the turn, once;
- `claude -p` with agora's hooks (their asyncRewake `wake` entries too) ends about
  as fast as without them;
- an idle interactive Claude Code (in a pseudo-terminal) wakes within 2 s for a
  message posted from another process, once per message, and again after its stop;
  so does OpenCode's TUI, through agora's plugin, which also wakes it with a message
  posted mid-turn as the turn ends (it has no stop hook), and none in `opencode run`;
- Copilot CLI in a trusted repository with Claude Code's hooks (hook install claude)
  runs them with no fault in its log, takes the brief from them, and is refused an
  edit of a file another agent reserved by Claude Code's edit hook;
- each client's editing tool, through agora's check before each edit: refused on a
  file another agent reserved, warned of one another agent edited a minute ago
  (that agent told too), silent on a free one, let through with agora down; every
  hook agora wrote short and naming agora's own command;
- MCP round trips over stdio and HTTP: a tool result carrying the message reaches
  the model, and the model's post lands in agora;
- a hook that cannot reach agora tells the person in one line, wherever the client
  shows a hook's systemMessage (learnt first with a probe hook, for each client
  headless and, for Claude Code and Codex, in its TUI).

How each client is made to run here (no login, no dialog, no network):
- Claude Code: ANTHROPIC_BASE_URL, an API key pre-approved in $HOME/.claude.json
  with onboarding and the project's trust marked done, nonessential traffic off.
- Codex: a model provider in $CODEX_HOME/config.toml, the project trusted there,
  and each hook trusted by writing the `trusted_hash` Codex computes itself (what
  "Trust all" in its TUI writes; codex_hook_trust), not --dangerously-bypass-hook-trust,
  so the run proves the file a person would trust is the one that works.
- Gemini CLI: GOOGLE_GEMINI_BASE_URL, an API key, security.auth.selectedType
  "gemini-api-key" in the user settings, the project in trustedFolders.json.
- Qwen Code: OPENAI_BASE_URL and --auth-type openai (Chat Completions).
- GitHub Copilot CLI: COPILOT_PROVIDER_BASE_URL (Chat Completions), offline, no
  auto-update; agora's hooks in the user's file, which needs no folder trust.
- OpenCode: a provider at the fake model's Chat Completions in opencode.json, no
  auto-update, sharing or downloads; the plugin package it would install into each
  folder holding a plugin (~20 s a run) copied in from opencode-config/.

The clients are found under $AGORA_CLIENTS (default .interop/, as `make interop`
installs them): claude/node_modules/@anthropic-ai/claude-code-linux-x64/claude,
codex/node_modules/@openai/codex-linux-x64/vendor/*/bin/codex,
gemini/node_modules/@google/gemini-cli/bundle/gemini.js and
qwen/node_modules/@qwen-code/qwen-code/cli-entry.js (both run with the `node` on
PATH), copilot/node_modules/@github/copilot-linux-x64/copilot and
opencode/node_modules/opencode-linux-x64/bin/opencode. A client that is not
installed is one failing check. $AGORA_PY names the agora.py under test (default
the one beside this folder). The hook files are written as a person writes them,
by `agora.py hook install CLIENT`. Arguments name the clients to run (default all).

Every client run gets a scratch HOME (and CODEX_HOME), an environment with nothing
of the machine's user in it, only loopback addresses to talk to (update checks,
telemetry and plugin sync off), a hard timeout, its own process group (killed at
the end), and a sweep, by pid, for any process still naming the run's scratch
folder (a waiting hook, a daemon). Standard library only.
"""

import contextlib
import functools
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
import harness  # noqa: E402
from harness import ROOT, summary  # noqa: E402
from fake_model import FakeModel, request_text, tool, tool_names  # noqa: E402

AGORA = os.path.abspath(os.environ.get("AGORA_PY") or os.path.join(ROOT, "agora.py"))
PYTHON = sys.executable
CLIENTS = os.path.abspath(os.environ.get("AGORA_CLIENTS") or os.path.join(ROOT, ".interop"))
RUN_TIMEOUT = 60            # seconds any one client run may take
UNREACHABLE = "http://127.0.0.1:9"       # nothing listens there: agora is down


def check(name, ok, detail=""):
    """harness.check, answering whether the check passed (so a scenario can stop)."""
    harness.check(name, ok, detail)
    return bool(ok)


def note(text):
    """Print an indented line of evidence (a fragment, a time) under the checks."""
    print(f"    {text}", flush=True)


def fragment(haystack, needle, before=110, after=40):
    """Answer NEEDLE with some of its context in HAYSTACK, on one line, the shell
    commands agora names shortened (or None when NEEDLE is not there)."""
    haystack = re.sub(r"`[^`]*agora\.py read[^`]*`", "`...`", " ".join(haystack.split()))
    haystack = re.sub(r"\S*/agora\.py hook", "agora.py hook", haystack)
    at = haystack.find(needle)
    if at < 0:
        return None
    return haystack[max(0, at - before):at + len(needle) + after]


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


def processes():
    """Yield (pid, command line) for every other process of this user."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if argv:
            yield int(entry), argv


def processes_naming(*words):
    """Answer the pids of our processes whose command line holds every one of WORDS."""
    return [pid for pid, argv in processes() if all(word in argv for word in words)]


def sweep(marker):
    """Kill, by pid, every process of ours whose command line names MARKER (a scratch
    folder unique to one run): what a client left behind (a hook still waiting, a
    daemon). Answer their command lines."""
    left = []
    for pid, argv in processes():
        if marker in argv:
            left.append(argv)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return left


def run(argv, cwd, env, timeout=RUN_TIMEOUT):
    """Run ARGV in its own process group with a hard TIMEOUT; answer a Run."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, text=True, start_new_session=True,
                               stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process)
        try:
            out, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:     # a child in another group holds the pipes
            process.stdout.close(), process.stderr.close()
            out, err = "", ""
    finally:
        kill_group(process)
    process.wait()
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

@functools.lru_cache(maxsize=None)
def under_test():
    """Answer the agora.py under test (AGORA), loaded as a module once."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("agora_under_test", AGORA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hook_argv(event, client, name, db):
    """Answer the command line of one agora hook, as `hook install` writes it."""
    return under_test().hook_argv(event, client, ["--as", name, "--db", db])


def write_hooks(client, scratch, name, url=None):
    """Write CLIENT's hook file the way a person does, with `agora.py hook install CLIENT`
    (--as NAME on the scratch database, or --url URL): in SCRATCH's project, or in its
    HOME where that is the client's default; answer the file's path."""
    who = ["--url", url] if url else ["--as", name, "--db", scratch.db]
    subprocess.run([PYTHON, AGORA, "hook", "install", client, *who, "--dir",
                    scratch.project], check=True, capture_output=True, timeout=30,
                   env=dict(os.environ, HOME=scratch.home))    # its bytecode cache: the client's
    facts = under_test().HOOK_CLIENTS[client]
    return os.path.join(scratch.home if facts.user_first else scratch.project,
                        facts.files[facts.user_first])


def rewrite_hooks(path, change):
    """Give each of agora's hooks in the hook file at PATH the shell command
    CHANGE(command, event) answers (Claude Code's exec form becomes a command line;
    OpenCode's plugin runs `sh -c` of it)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".js"):
        line = re.search(r"^const HOOKS = (.*);$", source, re.M)
        hooks = {event: ["sh", "-c", change(shlex.join(argv), event)]
                 for event, argv in json.loads(line.group(1)).items()}
        source = source.replace(line.group(0), f"const HOOKS = {json.dumps(hooks)};")
    else:
        data = json.loads(source)
        for groups in data["hooks"].values():
            for group in groups:
                for handler in group.get("hooks", [group]):
                    key = "bash" if "bash" in handler else "command"    # Copilot's: bash
                    words = ([handler[key]] + handler["args"] if "args" in handler
                             else shlex.split(handler[key]))
                    if "hook" not in words:
                        continue
                    handler.pop("args", None)
                    handler[key] = change(shlex.join(words), words[words.index("hook") + 1])
        source = json.dumps(data, indent=2)
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)


# -- the clients ------------------------------------------------------------------

class Client:
    """What every driver has: a name, where its program is (program()), whether it is
    there, and headless(scratch, model, prompt, ...) answering a Run."""

    name = "?"

    def available(self):
        return all(os.path.exists(part) for part in self.program()[-1:])


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

    def config(self, scratch, model, mcp=None, model_name="gpt-fake"):
        """Write $CODEX_HOME/config.toml: provider, model, trust, hook trust, MCP servers."""
        lines = ['model_provider = "fake"', f"model = {json.dumps(model_name)}",
                 'check_for_update_on_startup = false', "",
                 "[model_providers.fake]", 'name = "fake"',
                 f"base_url = {json.dumps(model.url + '/v1')}", 'env_key = "FAKE_API_KEY"',
                 'wire_api = "responses"', "",
                 # no plugin sync (it calls outside hosts), no TUI app-server daemon
                 # (it outlives the TUI), no analytics
                 "[features]", "plugins = false", "daemon_auto_start = false", "",
                 "[analytics]", "enabled = false", "",
                 f"[projects.{json.dumps(scratch.project)}]", 'trust_level = "trusted"', ""]
        for key, digest in codex_hook_trust(scratch.project).items():
            lines += [f"[hooks.state.{json.dumps(key)}]", f"trusted_hash = {json.dumps(digest)}",
                      ""]
        for name, server in (mcp or {}).items():
            lines.append(f"[mcp_servers.{name}]")
            lines += [f"{key} = {toml_value(value)}" for key, value in server.items()]
            lines.append("")
        scratch.write(".codex/config.toml", "\n".join(lines))

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None,
                 model_name="gpt-fake"):
        self.config(scratch, model, mcp, model_name)
        return run(self.program() + ["exec", "--skip-git-repo-check", "--color", "never",
                                     *extra, prompt],
                   scratch.project, self.env(scratch, model), timeout)


def toml_value(value):
    """Answer VALUE (str, bool, int, float, list, dict) written as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(key)} = {toml_value(item)}"
                                for key, item in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


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
                if handler.get("statusMessage") is not None:    # (not exercised here)
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


class Qwen(Client):
    """Qwen Code 0.24.4: Chat Completions at the fake model (OPENAI_BASE_URL, --auth-type
    openai), usage statistics off; its settings carry agora's hooks (hook install qwen)."""

    name = "qwen"

    def program(self):
        return ["node", os.path.join(CLIENTS, "qwen", "node_modules", "@qwen-code",
                                     "qwen-code", "cli-entry.js")]

    def env(self, scratch, model):
        return dict(base_env(scratch), OPENAI_BASE_URL=model.url + "/v1",
                    OPENAI_API_KEY="sk-fake", OPENAI_MODEL="fake-model")

    def prepare(self, scratch, model, mcp=None):
        settings = {"privacy": {"usageStatisticsEnabled": False},
                    "general": {"disableAutoUpdate": True}}
        if mcp:
            settings["mcpServers"] = mcp
        scratch.write(".qwen/settings.json", settings)

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None):
        self.prepare(scratch, model, mcp)
        return run(self.program() + [prompt, "--auth-type", "openai", *extra],
                   scratch.project, self.env(scratch, model), timeout)


class Copilot(Client):
    """GitHub Copilot CLI 1.0.102: its own provider settings at the fake model's Chat
    Completions (COPILOT_PROVIDER_BASE_URL, offline, no auto-update), all tools allowed;
    agora's hooks in the user's ~/.copilot/hooks/agora.json (hook install copilot)."""

    name = "copilot"

    def program(self):
        return [os.path.join(CLIENTS, "copilot", "node_modules", "@github",
                             "copilot-linux-x64", "copilot")]

    def env(self, scratch, model):
        return dict(base_env(scratch), COPILOT_OFFLINE="true", COPILOT_AUTO_UPDATE="false",
                    COPILOT_PROVIDER_BASE_URL=model.url + "/v1",
                    COPILOT_PROVIDER_API_KEY="sk-fake", COPILOT_MODEL="gpt-4.1")

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None):
        if mcp:
            scratch.write(".copilot/mcp-config.json", {"mcpServers": mcp})
        return run(self.program() + ["-p", prompt, "--allow-all-tools", *extra],
                   scratch.project, self.env(scratch, model), timeout)


class OpenCode(Client):
    """OpenCode 1.18.33: a provider "fake" (@ai-sdk/openai-compatible) at the fake model's
    Chat Completions in $HOME/.config/opencode/opencode.json, no auto-update, sharing,
    models fetch or LSP download; agora's plugin in the project's .opencode/plugins
    (hook install opencode). OpenCode installs its plugin package into each folder that
    holds plugins (~20 s); a copy of it from opencode-config/ (as `make interop`
    installs it) spares each run that."""

    name = "opencode"

    def program(self):
        return [os.path.join(CLIENTS, "opencode", "node_modules", "opencode-linux-x64", "bin",
                             "opencode")]

    def env(self, scratch, model):
        return dict(base_env(scratch), FAKE_BASE_URL=model.url + "/v1",
                    OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1",
                    OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")

    def prepare(self, scratch, model, mcp=None):
        package = os.path.join(CLIENTS, "opencode-config")
        for folder in (os.path.join(scratch.home, ".config", "opencode"),
                       os.path.join(scratch.project, ".opencode")):
            if not os.path.isdir(os.path.join(folder, "node_modules")):
                shutil.copytree(package, folder, dirs_exist_ok=True, symlinks=True)
        config = {"provider": {"fake": {"npm": "@ai-sdk/openai-compatible",
                                        "options": {"baseURL": "{env:FAKE_BASE_URL}",
                                                    "apiKey": "sk-fake"},
                                        "models": {"fake-model": {"tool_call": True}}}},
                  "model": "fake/fake-model", "small_model": "fake/fake-model",
                  "autoupdate": False, "share": "disabled"}
        if mcp:
            config["mcp"] = mcp
        scratch.write(".config/opencode/opencode.json", config)

    def headless(self, scratch, model, prompt, timeout=RUN_TIMEOUT, extra=(), mcp=None):
        self.prepare(scratch, model, mcp)
        return run(self.program() + ["run", *extra, prompt], scratch.project,
                   self.env(scratch, model), timeout)


# -- reading what reached the model ------------------------------------------------

def conversation(request):
    """Answer the list of turns a recorded request carries: Anthropic messages, Responses
    input items or Gemini contents."""
    body = request.get("body") or {}
    return body.get("messages") or body.get("input") or body.get("contents") or []


def text_from(request, needle):
    """Answer the text of REQUEST's conversation from the last item holding NEEDLE on
    (the prompt and whatever the client put beside it), or "" when none holds it."""
    items = conversation(request)
    for index in range(len(items) - 1, -1, -1):
        if needle in request_text({"body": items[index]}):
            return "\n".join(request_text({"body": item}) for item in items[index:])
    return ""


def added_text(request, previous):
    """Answer the text of what REQUEST's conversation has beyond PREVIOUS's."""
    return "\n".join(request_text({"body": item})
                     for item in conversation(request)[len(conversation(previous)):])


def chain_after_session_start(path, argv, log, prompt_after=0):
    """Make the session-start hook in the hook file at PATH run ARGV right after it, in
    the same command: so a message can arrive after the brief and before the prompt
    (the brief marks what it reports as told, and a headless run has no gap between
    its start and its prompt); the prompt hook starts PROMPT_AFTER s late. Each hook
    first adds its event's name to the file LOG, as a line."""
    def change(command, event):
        if event == "session-start":
            command = f"({command}); {shlex.join(argv)} >/dev/null 2>&1"     # it execs
        elif event == "prompt" and prompt_after:
            command = f"sleep {prompt_after}; {command}"
        return f"echo {event} >> {shlex.quote(log)}; {command}"
    rewrite_hooks(path, change)


def post_argv(db, to, body, sender="bob"):
    return [PYTHON, AGORA, "post", f"body={body}", f"to={to}", "--as", sender, "--db", db]


LEFT_BEHIND = []    # processes a session left running (killed): the run's last check says


class Session:
    """One scenario's world: a Scratch and a started FakeModel; on leaving, the model
    stops and any process still naming the scratch folder is killed (and kept in
    LEFT_BEHIND)."""

    def __init__(self, base, label):
        self.scratch = Scratch(base, label)
        self.model = FakeModel()

    def __enter__(self):
        self.model.start()
        return self.scratch, self.model

    def __exit__(self, *exc):
        self.model.stop()
        left = self.scratch.sweep()
        if left:
            note(f"killed {len(left)} process(es) left behind: {left[0][:140]}")
            LEFT_BEHIND.extend(left)
        if self.model.errors:
            note(f"fake model callback errors: {self.model.errors}")


# -- scenarios --------------------------------------------------------------------

def ended_well(label, done, model):
    """Check that the run DONE ended by itself with exit 0 after a model request; answer
    the turn requests (none when it did not)."""
    turns = model.turns()
    ok = check(f"{label}: the run ends by itself with exit 0 and a request",
               not done.timed_out and done.returncode == 0 and turns, done)
    return turns if ok else []


def hooks_session(client, base):
    """The brief in request 1, news next to the prompt, a stop continuation: one run.

    The session-start hook is followed by a post (a message arriving after the brief,
    before the prompt); the fake model's callback posts a second message before it
    answers request 1, which the stop hook must turn into request 2, once. A client
    with no stop hook (OpenCode) ends after request 1: its waiter, not headless, takes
    the second message (opencode_interactive_wake)."""
    label = f"{client.name} hooks"
    name = f"{client.name}-agent"
    stops = any(ours == "stop" for _, ours in under_test().HOOK_CLIENTS[client.name].events)
    with Session(base, f"{client.name}-hooks") as (scratch, model):
        agora(scratch.db, "brief", "--as", name)
        path = write_hooks(client.name, scratch, name)
        # Copilot CLI runs its prompt hook beside the session-start one, at once in a
        # headless run; a person types the prompt later: so does this run
        log = os.path.join(scratch.root, "hooks.log")
        chain_after_session_start(path, post_argv(scratch.db, name,
                                                  "NEWS-BEFORE-PROMPT please review PR 7"),
                                  log, prompt_after=2 if client.name == "copilot" else 0)
        model.before(1, lambda request: dm(scratch.db, name, "NEWS-MID-TURN main is red"))
        done = client.headless(scratch, model, "PROMPT-7 hello")
        turns = ended_well(label, done, model)
        if not turns:
            return
        first = request_text(turns[0])
        brief = f"{name} (no status"
        ran = client.name != "codex" or "hook: SessionStart" in done.stderr
        check(f"{label}: request 1 carries the session-start brief", brief in first,
              first[-400:] if ran else "Codex ran no hook: is codex_hook_trust's hash "
                                       "still the one Codex computes?")
        note(f"brief: {fragment(first, brief, 150)!r}")
        beside = text_from(turns[0], "PROMPT-7")
        check(f"{label}: request 1 carries the news next to the prompt",
              "NEWS-BEFORE-PROMPT" in beside, beside[-400:])
        note(f"prompt news: {fragment(beside, 'NEWS-BEFORE-PROMPT', 160)!r}")
        if stops:
            second = added_text(turns[1], turns[0]) if len(turns) > 1 else ""
            check(f"{label}: the stop hook continues the turn with the mid-turn message",
                  "NEWS-MID-TURN" in second, [len(turns), second[-300:]])
            note(f"continuation: {fragment(second, 'NEWS-MID-TURN', 220)!r}")
        check(f"{label}: {'one continuation, then' if stops else 'no stop hook:'} the run "
              "stops", len(turns) == (2 if stops else 1), f"{len(turns)} requests")
        with open(log, encoding="utf-8") as f:
            hooks_run = f.read().split()
        if not stops:                   # a waiter there would wait for a run that ended
            check(f"{label}: the headless run starts no waiter", "wake" not in hooks_run,
                  hooks_run)
        note(f"wall {done.wall:.1f}s, {len(model.requests)} requests "
             f"({len(turns)} turns), hooks run: {', '.join(hooks_run)}")


def copilot_runs_claude_hooks(client, base):
    """A repository with agora's Claude Code hooks only (hook install claude), in a folder
    Copilot CLI trusts: Copilot runs them too, as shell strings, and must get its own
    answer shape from them (the brief in request 1; a refused edit of a file bob
    reserved, which Copilot hands the edit hook in Claude's names with its own
    arguments) with nothing failing in its log."""
    label = "copilot in a repo with claude's hooks"
    name = "claude-agent"
    with Session(base, "copilot-claude-hooks") as (scratch, model):
        agora(scratch.db, "brief", "--as", name)
        agora(scratch.db, "reserve", "paths=src/**", "reason=rewrite", "--as", "bob")
        write_hooks("claude", scratch, name)
        os.makedirs(os.path.join(scratch.project, "src"))
        reserved = os.path.join(scratch.project, "src", "lex.py")
        model.set_script([EDIT_CALLS["copilot"](reserved, "src/lex.py", "EDIT"), "done"])
        scratch.write(".copilot/config.json", {"trustedFolders": [scratch.project]})
        done = client.headless(scratch, model, "PROMPT-9 hello")
        turns = ended_well(label, done, model)
        if not turns:
            return
        first = request_text(turns[0])
        check(f"{label}: request 1 carries the brief", f"{name} (no status" in first,
              first[-300:])
        result = added_text(turns[1], turns[0]) if len(turns) > 1 else ""
        check(f"{label}: Claude Code's edit hook refuses its edit of a file bob reserved",
              not os.path.exists(reserved) and "reserved by bob" in result, result[-300:])
        logs = ""
        for path in glob.glob(os.path.join(scratch.home, ".copilot", "logs", "*")):
            with open(path, encoding="utf-8", errors="replace") as f:
                logs += f.read()
        failed = re.findall(r"\[ERROR\] \[rust:hooks\].*", logs)   # how a failing hook is logged
        check(f"{label}: no hook fails in its log", "Loading repo hooks" in logs and not failed,
              failed[:3] or "it loaded no repository hooks")
        note(f"wall {done.wall:.1f}s, {len(turns)} turns, {len(logs.splitlines())} log lines")


# How the fake model asks each client to write a file (PATH absolute, RELATIVE to the
# project), and what makes the client offer its file-editing tools headless.
EDIT_CALLS = {
    "claude": lambda path, relative, text: tool("Write", {"file_path": path, "content": text}),
    "codex": lambda path, relative, text: tool(
        "apply_patch", f"*** Begin Patch\n*** Add File: {relative}\n+{text}\n*** End Patch\n"),
    "gemini": lambda path, relative, text: tool("write_file", {"file_path": path,
                                                               "content": text}),
    "qwen": lambda path, relative, text: tool("write_file", {"file_path": path,
                                                             "content": text}),
    "copilot": lambda path, relative, text: tool("create", {"path": path, "file_text": text}),
    "opencode": lambda path, relative, text: tool("write", {"filePath": path, "content": text}),
}
EDIT_OPTIONS = {"claude": ["--permission-mode", "acceptEdits"],
                "gemini": ["--approval-mode", "auto_edit"],
                "qwen": ["--approval-mode", "auto-edit"]}


def agora_commands(path):
    """Answer the command lines of agora's hooks in the hook file at PATH (OpenCode's
    plugin: its HOOKS, each as one shell line)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if path.endswith(".js"):
        hooks = json.loads(re.search(r"^const HOOKS = (.*);$", source, re.M).group(1))
        return [shlex.join(argv) for argv in hooks.values()]
    return [handler.get("bash", handler.get("command", ""))
            for groups in json.loads(source)["hooks"].values() for group in groups
            for handler in group.get("hooks", [group])
            if "hook" in str(handler.get("bash", handler.get("command", "")))]


def edits_checked(client, base):
    """Agora's check before each edit, live: the model asks to write a path bob reserved
    (the tool result it gets names bob; nothing is written), one bob edited a minute ago
    (written; the model's next request carries the warning; bob's news names the
    editor), and a free one (written, nothing added); then, with agora down, a path
    bob reserved is written all the same (an edit is never held hostage)."""
    label = f"{client.name} edits"
    name = f"{client.name}-agent"
    files = {"reserved": "src/parser/lex.py", "edited": "docs/guide.md", "free": "notes/free.txt"}
    for down in (False, True):
        with Session(base, f"{client.name}-edits{'-down' if down else ''}") as (scratch, model):
            agora(scratch.db, "brief", "--as", name)
            agora(scratch.db, "reserve", "paths=src/parser/**", "reason=parser rewrite",
                  "--as", "bob")
            store = under_test().Store(scratch.db)
            try:                # bob's mark, a minute old
                under_test().call(store, "edit", {"paths": [files["edited"]]},
                                  under_test().Caller("bob", True), int(time.time()) - 60,
                                  face="cli")
            finally:
                store.close()
            path = write_hooks(client.name, scratch, name, url=UNREACHABLE if down else None)
            if not down:
                command = os.path.join(scratch.home, ".agora", "bin", "agora")
                commands = agora_commands(path)
                check(f"{label}: each hook agora wrote is short and plainly agora's",
                      commands and all(len(line) < 200 and re.match(
                          rf"(exec )?{re.escape(command)} hook \S+ ", line) for line in commands),
                      commands)
                note(f"hook: {commands[-1]!r}")
            subprocess.run(["git", "init", "-q", scratch.project], check=True)
            for path in files.values():         # some clients create no folders
                os.makedirs(os.path.dirname(os.path.join(scratch.project, path)), exist_ok=True)
            order = ["reserved"] if down else ["reserved", "edited", "free"]
            model.set_script([EDIT_CALLS[client.name](os.path.join(scratch.project, files[kind]),
                                                      files[kind], f"EDIT-{kind.upper()}")
                              for kind in order] + ["done"])
            # Codex offers apply_patch only to a model of its own catalog
            catalog = {"model_name": "gpt-5.5"} if client.name == "codex" else {}
            done = client.headless(scratch, model, "PROMPT-EDITS write the files",
                                   extra=EDIT_OPTIONS.get(client.name, []), **catalog)
            turns = ended_well(f"{label}{' (agora down)' if down else ''}", done, model)
            if len(turns) < len(order) + 1:
                check(f"{label}: the model got a tool result for each edit",
                      False, f"{len(turns)} requests")
                continue
            results = [added_text(turns[at + 1], turns[at]) for at in range(len(order))]
            written = {kind: os.path.exists(os.path.join(scratch.project, files[kind]))
                       for kind in order}
            if down:
                check(f"{label}: agora down, the reserved path is written all the same",
                      written["reserved"], results[0][-300:])
                continue
            check(f"{label}: a path bob reserved is refused, the tool result naming bob, "
                  "nothing written", not written["reserved"] and "reserved by bob" in results[0],
                  [written["reserved"], results[0][-300:]])
            note(f"refusal: {fragment(results[0], 'reserved by bob', 60, 90)!r}")
            warning = "bob edited docs/guide.md 1m ago"
            mail = agora(scratch.db, "read", "--as", "bob")
            check(f"{label}: a path bob edited a minute ago is written, the model's next "
                  "request warns of bob, and bob hears of the editor",
                  written["edited"] and warning in results[1] and
                  f"{name} is editing docs/guide.md" in mail,
                  [written["edited"], results[1][-300:], mail[-200:]])
            note(f"warning: {fragment(results[1], warning, 60, 60)!r}")
            check(f"{label}: a free path is written with nothing added",
                  written["free"] and "bob" not in results[2]
                  and "before you change it" not in results[2],
                  [written["free"], results[2][-300:]])


def claude_print_speed(client, base):
    """`claude -p` with agora's hooks, wake entries included, against without hooks."""
    times = {}
    for hooked in (False, True):
        with Session(base, f"claude-speed-{'hooks' if hooked else 'bare'}") as (scratch, model):
            if hooked:
                write_hooks("claude", scratch, "claude-agent")
            times[hooked] = client.headless(scratch, model, "hello", timeout=RUN_TIMEOUT)
    bare, hooked = times[False], times[True]
    note(f"claude -p: without hooks {bare.wall:.2f}s, with agora's hooks "
         f"{hooked.wall:.2f}s{' (killed at the timeout)' if hooked.timed_out else ''}")
    check("claude -p with agora's hooks (wake included) ends about as fast as without",
          not hooked.timed_out and hooked.returncode == 0 and hooked.wall < bare.wall + 5,
          f"{hooked.wall:.1f}s against {bare.wall:.1f}s")


def mcp_round_trip(client, base, transport):
    """The model calls agora's read, then post; the tool result with the message must
    reach the model and the post must land in agora."""
    label = f"{client.name} mcp over {transport}"
    name = f"{client.name}-{transport}"
    with Session(base, f"{client.name}-mcp-{transport}") as (scratch, model):
        server = AgoraServer(scratch.db) if transport == "http" else None
        try:
            token = mint(scratch.db, name) if server else None
            ok, extra = client_add_mcp(client, scratch, model, name, server, token)
            if ok is not None and not check(f"{label}: the client takes agora as an MCP "
                                            "server", ok, extra):
                return
            dm(scratch.db, name, "MAIL-FOR-TOOLS see the log")
            model.set_script([McpScript(client)] * 6)
            done = client.headless(scratch, model, "read your mail",
                                   **client_mcp_options(client, extra))
            turns = model.turns()
            results = [added_text(t, p) for p, t in zip(turns, turns[1:])]
            carrying = [r for r in results if "MAIL-FOR-TOOLS" in r]
            check(f"{label}: the read tool's result with the message reaches the model",
                  carrying, [done, [t["reply"] for t in turns]])
            if carrying:
                note(f"tool result: {fragment(carrying[0], 'MAIL-FOR-TOOLS', 100)!r}")
            posted = [m for m in public_history(scratch.db) if m["body"] == "POSTED-BY-MODEL"]
            check(f"{label}: the model's post lands in #public as {name}",
                  posted and posted[0]["sender"] == name, public_history(scratch.db))
        finally:
            if server:
                server.close()


class McpScript:
    """The fake model's side of an MCP round trip: call agora's read, then post, then
    say "done". Each tool is named as CLIENT offers it: Claude Code's
    mcp__agora__read (first loaded through ToolSearch while it is deferred), Codex's
    read in the namespace tool mcp__agora, Gemini CLI's mcp_agora_read, Qwen Code's
    mcp__agora__read (deferred: looked up with tool_search, then run by tool_call),
    Copilot CLI's agora-read, OpenCode's agora_read."""

    NAMES = {"claude": "mcp__agora__{}", "gemini": "mcp_agora_{}", "qwen": "mcp__agora__{}",
             "copilot": "agora-{}", "opencode": "agora_{}"}

    def __init__(self, client, steps=(("read", {}), ("post", {"body": "POSTED-BY-MODEL"}))):
        self.client, self.steps = client, list(steps)
        self.searched = False

    def __call__(self, request):
        if not self.steps:
            return "done"
        name, arguments = self.steps[0]
        client = self.client.name
        if client == "codex":
            reply = tool(name, arguments, namespace="mcp__agora")
        else:
            wanted = self.NAMES[client].format(name)
            if client == "claude" and wanted not in tool_names(request):
                return tool("ToolSearch", {"query": "select:" + ",".join(
                    self.NAMES[client].format(step) for step, _ in self.steps),
                    "max_results": 5})
            if client == "qwen" and not self.searched:
                self.searched = True
                return tool("tool_search", {"query": "select:" + ",".join(
                    self.NAMES[client].format(step) for step, _ in self.steps)})
            reply = (tool("tool_call", {"name": wanted, "arguments": arguments})
                     if client == "qwen" else tool(wanted, arguments))
        self.steps.pop(0)
        return reply


def asks_a_person(client, base):
    """The model asks a person for a decision through MCP over HTTP (post_task for=ann), then
    waits with news wait=30 tasks=true; ann approves (done, as she would on the page, here
    from the command line) and her answer reaches the model as that tool's result."""
    label = f"{client.name} asks a person"
    name = f"{client.name}-asker"
    with Session(base, f"{client.name}-asks-a-person") as (scratch, model):
        server = AgoraServer(scratch.db)
        try:
            token = mint(scratch.db, name)
            agora(scratch.db, "join", "name=ann", "person=true")
            ok, extra = client_add_mcp(client, scratch, model, name, server, token)
            if ok is not None and not check(f"{label}: the client takes agora as an MCP "
                                            "server", ok, extra):
                return
            model.set_script([McpScript(client, [
                ("post_task", {"title": "DROP-THE-LEGACY-TABLE?", "for": "ann"}),
                ("news", {"wait": 30, "tasks": True})])] * 8)
            answered = []

            def ann_decides():
                deadline = time.monotonic() + RUN_TIMEOUT
                while time.monotonic() < deadline and not answered:
                    tasks = json.loads(agora(scratch.db, "tasks", "--as", "ann", "--json"))
                    for task in tasks["tasks"]:
                        if task["title"] == "DROP-THE-LEGACY-TABLE?":
                            time.sleep(1)       # the model is waiting in news by now
                            agora(scratch.db, "done", f"id={task['id']}", "result=GO-AHEAD",
                                  "--as", "ann")
                            answered.append(task["id"])
                    time.sleep(0.3)
            deciding = threading.Thread(target=ann_decides, daemon=True)
            deciding.start()
            done = client.headless(scratch, model, "ask ann before dropping the table",
                                   **client_mcp_options(client, extra))
            deciding.join(5)
            turns = model.turns()
            results = [added_text(t, p) for p, t in zip(turns, turns[1:])]
            heard = [r for r in results if "ann approved your task" in r and "GO-AHEAD" in r]
            check(f"{label}: the decision is posted for ann, and her answer reaches the model "
                  "as the news tool's result", answered and heard,
                  [done, [t["reply"] for t in turns]])
            if heard:
                note(f"news result: {fragment(heard[0], 'ann approved', 100)!r}")
        finally:
            server.close()


def client_add_mcp(client, scratch, model, name, server, token):
    """Register agora as an MCP server with CLIENT: stdio (`agora.py stdio --as NAME`)
    or HTTP (SERVER's /mcp with TOKEN as a bearer header). Answer (whether `claude mcp
    add` took it, None for the others: their config goes in with the run; the config)."""
    stdio = [PYTHON, AGORA, "stdio", "--as", name, "--db", scratch.db]
    url, headers = server and server.url + "/mcp", {"Authorization": f"Bearer {token}"}
    if client.name == "claude":
        if server:
            done = client.mcp_add(scratch, model, "--transport", "http", "agora", url,
                                  "--header", f"Authorization: Bearer {token}")
        else:
            done = client.mcp_add(scratch, model, "agora", "--", *stdio)
        return done.returncode == 0, done
    if client.name == "codex":
        config = ({"url": url, "http_headers": headers} if server
                  else {"command": stdio[0], "args": stdio[1:]})
    elif client.name == "copilot":
        config = dict({"type": "http", "url": url, "headers": headers} if server else
                      {"type": "local", "command": stdio[0], "args": stdio[1:]}, tools=["*"])
    elif client.name == "opencode":
        config = dict({"type": "remote", "url": url, "headers": headers} if server else
                      {"type": "local", "command": stdio}, enabled=True)
    else:                               # Gemini CLI and its fork, Qwen Code
        config = ({"httpUrl": url, "headers": headers} if server
                  else {"command": stdio[0], "args": stdio[1:]})
        config["trust"] = True          # no confirmation: -p cannot ask
    return None, {"agora": config}


def client_mcp_options(client, config):
    """Answer the keyword arguments of CLIENT.headless for an MCP run."""
    if client.name == "claude":
        return {"extra": ["--allowedTools", "mcp__agora"]}
    return {"mcp": config}


# -- a pseudo-terminal, for the interactive client --------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]"          # CSI: colours, moves, modes
                  r"|\x1b\][^\x07\x1b]*(\x07|\x1b\\)"          # OSC: titles, links
                  r"|\x1b[()][0-9A-Za-z]|\x1b[=>78]")       # charsets, keypad, save


class Terminal:
    """A program in a pseudo-terminal of its own (160x50), in its own process group; a
    thread drains its output (answering cursor-position queries) into `screen`."""

    def __init__(self, argv, cwd, env, rows=50, cols=160):
        import fcntl
        import struct
        import termios
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave,
                                        stderr=slave, start_new_session=True)
        os.close(slave)
        self.master, self.output = master, bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.5)
                if not ready:
                    if self.process.poll() is not None:
                        return
                    continue
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output.extend(data)
            if b"\x1b[6n" in data:                  # where is the cursor? somewhere
                self.type(b"\x1b[1;1R")

    def type(self, data):
        """Send DATA (str or bytes) as if typed."""
        with contextlib.suppress(OSError):
            os.write(self.master, data.encode() if isinstance(data, str) else data)

    def screen(self):
        """Answer everything shown so far as plain text: cursor moves to the right become
        spaces, other escape sequences go."""
        text = bytes(self.output).decode("utf-8", "replace")
        text = re.sub(r"\x1b\[(\d*)C", lambda m: " " * int(m.group(1) or 1), text)
        return ANSI.sub("", text)

    def shows(self, needle):
        """Answer whether NEEDLE was shown, ignoring whitespace (a TUI draws with moves)."""
        return "".join(needle.split()) in "".join(self.screen().split())

    def wait_for_text(self, needle, timeout):
        """Block until NEEDLE was shown (answer True) or TIMEOUT s passed."""
        return bool(wait_until(lambda: self.shows(needle), timeout, 0.1))

    def submit(self, text):
        """Type TEXT, then Enter on its own (typed together, a TUI may take it as a paste)."""
        self.type(text)
        time.sleep(0.5)
        self.type("\r")

    def quit(self, goodbye, grace=5):
        """Type GOODBYE (e.g. "/exit\r"); answer the exit status once the program ended
        by itself within GRACE s, or None."""
        if self.process.poll() is None:
            self.type(goodbye)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        return self.process.poll()

    def close(self, goodbye=None, grace=3):
        """Quit with GOODBYE if given, then kill the process group; answer the status."""
        if goodbye:
            self.quit(goodbye, grace)
        kill_group(self.process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        with contextlib.suppress(OSError):
            os.close(self.master)
        return self.process.returncode


def wait_until(predicate, timeout, step=0.05):
    """Poll PREDICATE until it answers something true (answer it) or TIMEOUT s pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


# What a TUI shows once it takes a prompt, and what quits it
READY_TEXT = {"claude": "shift+tab to cycle", "codex": "Ask Codex to do anything",
              "opencode": "Ask anything"}
GOODBYE = {"claude": "/exit\r", "codex": "\x03\x03", "opencode": "\x03\x03"}


def woken(label, model, db, name, round_, token):
    """Post TOKEN to NAME from another process; answer whether it started a model request
    within 2 s (checked, and the latency noted), and for ROUND_ 1 check that the model
    reads it as news from other agents."""
    posted = time.monotonic()
    dm(db, name, token)
    hit = model.wait_for(lambda r: r["kind"] == "turn" and token in request_text(r), 10)
    latency = hit["monotonic"] - posted if hit else None
    note(f"wake {round_}: request {f'{latency:.2f}s' if hit else 'never'} after the post")
    if not check(f"{label}: message {round_} wakes it within 2 s", hit and latency <= 2,
                 f"{latency}"):
        return False
    if round_ == 1:
        seen = request_text(hit)
        note(f"as the model sees it: {fragment(seen, token, 360)!r}")
        check(f"{label}: the model reads the wake as news from other agents",
              "News from other agents in agora" in seen
              and "Stop hook blocking error" not in seen, seen[-500:])
    return True


def reached_once(label, model, before, round_, token):
    """Check that one request came after the BEFORE first ones, carrying TOKEN once."""
    turns = model.turns()
    copies = request_text(turns[-1]).count(token)
    check(f"{label}: message {round_} reaches the model once",
          len(turns) == before + 1 and copies == 1,
          f"{len(turns) - before} new requests, {copies} copies")


def claude_interactive_wake(client, base):
    """Idle interactive Claude Code with agora's hooks: a message posted from another
    process must start a model request within 2 s carrying it, once; after that
    turn's stop, the re-armed waiter must wake it again for a second message; /exit
    must leave no waiter behind."""
    label = "claude interactive"
    name = "claude-tty"
    with Session(base, "claude-tty") as (scratch, model):
        write_hooks("claude", scratch, name)
        client.prepare(scratch, model)

        def waiters():
            return set(processes_naming(scratch.root, "hook", "wake"))
        terminal = Terminal(client.program(), scratch.project, client.env(scratch, model))
        try:
            armed = wait_until(waiters, 20)
            if not check(f"{label}: starts idle with its wake hook waiting", armed,
                         terminal.screen()[-600:]):
                return
            time.sleep(1.0)             # let the session settle at its prompt
            check(f"{label}: nothing reaches the model while idle", not model.turns(),
                  [t["turn"] for t in model.turns()])
            for round_, token in enumerate(("WAKE-ONE ping", "WAKE-TWO pong"), 1):
                before, old = len(model.turns()), waiters()
                if not woken(label, model, scratch.db, name, round_, token):
                    return
                # the turn ends; its stop arms a new waiter; nothing else may come
                rearmed = wait_until(lambda: waiters() - old, 10)
                time.sleep(2.0)
                reached_once(label, model, before, round_, token)
                check(f"{label}: after that turn's stop a new waiter is armed",
                      rearmed and len(waiters()) == 1, waiters())
            status = terminal.quit("/exit\r")
            left = not wait_until(lambda: not waiters(), 3)
            check(f"{label}: /exit ends it and leaves no waiter behind",
                  status is not None and not left, f"exit {status}, waiters {waiters()}")
        finally:
            terminal.close()


def opencode_interactive_wake(client, base):
    """Interactive OpenCode (its TUI) with agora's plugin. It has no stop hook: a message
    posted mid-turn must start the next request as soon as the turn ends, through the
    waiter the plugin arms at idle; then a message posted while idle must start a request
    within 2 s, once, read as news from other agents, and again for a second message
    after that turn; quitting must leave no waiter behind."""
    label = "opencode interactive"
    name = "opencode-tty"
    with Session(base, "opencode-tty") as (scratch, model):
        agora(scratch.db, "brief", "--as", name)
        write_hooks("opencode", scratch, name)
        client.prepare(scratch, model)
        model.before(1, lambda request: dm(scratch.db, name, "NEWS-MID-TURN main is red"))

        def waiters():
            return set(processes_naming(scratch.root, "hook", "wake"))
        terminal = Terminal(client.program(), scratch.project, client.env(scratch, model))
        try:
            if not check(f"{label}: shows its prompt", terminal.wait_for_text(
                    READY_TEXT["opencode"], 30), terminal.screen()[-600:]):
                return
            time.sleep(1.0)
            terminal.submit("PROMPT-8 hello")
            for _ in range(3):              # a TUI still loading drops the Enter: again
                if model.wait_turns(1, 4):
                    break
                terminal.type("\r")
            hit = model.wait_for(lambda r: r["kind"] == "turn"
                                 and "NEWS-MID-TURN" in request_text(r), 10)
            turns = model.turns()
            gap = hit and hit["monotonic"] - turns[0]["monotonic"]
            check(f"{label}: a message posted mid-turn starts the next request when the "
                  "turn ends", hit and hit is turns[1], [len(turns), gap])
            if not hit:
                return
            note(f"mid-turn message: request 2 came {gap:.2f}s after request 1")
            for round_, token in enumerate(("WAKE-ONE ping", "WAKE-TWO pong"), 1):
                armed = wait_until(waiters, 10)
                time.sleep(1.0)             # the turn has ended; its waiter waits
                before = len(model.turns())
                if not check(f"{label}: idle, with one waiter armed ({round_})",
                             armed and len(waiters()) == 1, waiters()):
                    return
                if not woken(label, model, scratch.db, name, round_, token):
                    return
                time.sleep(2.0)
                reached_once(label, model, before, round_, token)
            status = terminal.quit(GOODBYE["opencode"])
            left = not wait_until(lambda: not waiters(), 3)
            check(f"{label}: quitting ends it and leaves no waiter behind",
                  status is not None and not left, f"exit {status}, waiters {waiters()}")
        finally:
            terminal.close()


# -- what the person sees ---------------------------------------------------------

PROBE_HOOK = '''import json, sys
kind, event = sys.argv[1:3]
sys.stdin.read()
if kind == "SYSTEM-MESSAGE":
    print(json.dumps({"systemMessage": "PROBE-SYSTEM-MESSAGE " + event}))
else:
    print("PROBE-STDERR " + event, file=sys.stderr)
'''


def person_sees(client, done):
    """Answer what a person running CLIENT headless sees of a Run: Claude Code's
    stream-json `system` events of subtype informational (what an SDK front end
    shows) and its stderr; the others' stdout and stderr."""
    if client.name != "claude":
        return done.stdout + "\n" + done.stderr
    shown = [done.stderr]
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("type") == "system" and event.get("subtype") == "informational":
                shown.append(str(event.get("content")))
    return "\n".join(shown)


def interactive_screen(client, scratch, model, prompt="hello there"):
    """Start CLIENT's TUI in the project, submit PROMPT, wait for the turn to end;
    answer what the screen showed (or None when it never got to the prompt)."""
    (client.config if client.name == "codex" else client.prepare)(scratch, model)
    terminal = Terminal(client.program(), scratch.project, client.env(scratch, model))
    try:
        if not terminal.wait_for_text(READY_TEXT[client.name], 30):
            return None
        time.sleep(1.0)
        terminal.submit(prompt)
        for _ in range(3):              # a TUI still loading drops the Enter: again
            if model.wait_turns(1, 4):
                break
            terminal.type("\r")
        time.sleep(2.5)                 # the turn's answer and its stop hooks
        return terminal.screen()
    finally:
        terminal.close(GOODBYE[client.name])


def probed_surfaces(client, base, faces):
    """Answer the FACES of CLIENT that show a hook's systemMessage, learnt with a probe
    hook that prints a systemMessage, then one that prints on stderr (noted too)."""
    surfaces = set()
    for face in faces:
        for kind in ("SYSTEM-MESSAGE", "STDERR"):   # a systemMessage alone; stderr alone
            with Session(base, f"{client.name}-probe-{face}") as (scratch, model):
                probe = scratch.write("probe_hook.py", PROBE_HOOK, under=scratch.root)
                rewrite_hooks(write_hooks(client.name, scratch, "probe"), lambda command, event:
                              shlex.join([PYTHON, probe, kind, event]))
                if face == "headless":
                    seen = person_sees(client, client.headless(scratch, model, "hello"))
                else:
                    seen = interactive_screen(client, scratch, model) or ""
                flat = "".join(seen.split())
                where = [event for event in ("session-start", "prompt", "stop")
                         if f"PROBE-{kind}{event}" in flat]
                how = fragment(seen, f"PROBE-{kind}", 40, 20) if where else None
                note(f"{client.name} {face} shows a hook's "
                     f"{'systemMessage' if kind == 'SYSTEM-MESSAGE' else 'stderr (exit 0)'} "
                     f"for: {', '.join(where) or 'no event'}" + (f", as {how!r}" if how else ""))
                if kind == "SYSTEM-MESSAGE" and where:
                    surfaces.add(face)
    return surfaces


def shown_to_person(client, base):
    """Where CLIENT shows a hook's systemMessage and its stderr (a probe hook that
    prints both), then whether a hook that cannot reach agora says so to the person
    in one line, while the session still reaches the model. A client agora tells
    another way (Copilot CLI: exit 2 with the line on stderr; OpenCode: agora's plugin)
    must show it on every face."""
    faces = ["headless"] + (["tui"] if client.name in READY_TEXT else [])
    told_by = under_test().HOOK_CLIENTS[client.name].trouble
    surfaces = probed_surfaces(client, base, faces) if told_by == "systemMessage" else set(faces)
    for face in faces:
        with Session(base, f"{client.name}-down-{face}") as (scratch, model):
            write_hooks(client.name, scratch, None, url=UNREACHABLE)
            if face == "headless":
                done = client.headless(scratch, model, "hello")
                seen = person_sees(client, done)
                check(f"{client.name} with agora down: the session still runs",
                      done.returncode == 0 and not done.timed_out and model.turns(), done)
            else:
                seen = interactive_screen(client, scratch, model) or ""
            line = "agora hook: cannot reach"
            shown = "".join(line.split()) in "".join(seen.split())
            if face not in surfaces:
                note(f"{client.name} {face} shows no hook's message at all: agora cannot "
                     f"tell the person there ({'shown' if shown else 'not shown'})")
                continue
            check(f"{client.name} {face} with agora down: the person is told in a line",
                  shown, f"not among what it shows: {seen[-300:]!r}")
            if shown:
                where = (fragment(seen, "cannot reach", 80, 60)
                         or fragment("".join(seen.split()), "cannotreach", 60, 60))
                note(f"shown: {where!r}")


# -- the run ----------------------------------------------------------------------

def hook_times(base, samples=5):
    """Time agora's own hooks the way a client runs them (a fresh Python each time)."""
    scratch = Scratch(base, "hook-times")
    agora(scratch.db, "brief", "--as", "timer")
    for event in ("session-start", "prompt", "stop"):
        walls = []
        for _ in range(samples):
            started = time.monotonic()
            subprocess.run(hook_argv(event, "claude", "timer", scratch.db), input="{}",
                           capture_output=True, text=True, timeout=30)
            walls.append(time.monotonic() - started)
        walls.sort()
        note(f"agora hook {event}: median {walls[len(walls) // 2] * 1000:.0f} ms "
             f"(min {walls[0] * 1000:.0f}, max {walls[-1] * 1000:.0f})")


def main(argv=None):
    """Run every scenario for the clients named in ARGV (default all); print the checks
    and 'N passed, N failed'; answer the exit status."""
    drivers = (ClaudeCode(), Codex(), Gemini(), Qwen(), Copilot(), OpenCode())
    wanted = set(argv if argv is not None else sys.argv[1:]) or {d.name for d in drivers}
    clients = [client for client in drivers if client.name in wanted]
    base = tempfile.mkdtemp(prefix="agora-clients-")
    started = time.monotonic()
    print(f"agora under test: {AGORA}; clients from {CLIENTS}", flush=True)
    try:
        hook_times(base)
        for client in clients:
            if not check(f"{client.name} is installed", client.available(),
                         " ".join(client.program())):
                continue
            hooks_session(client, base)
            if client.name == "claude":
                claude_print_speed(client, base)
                claude_interactive_wake(client, base)
            if client.name == "opencode":
                opencode_interactive_wake(client, base)
            if client.name == "copilot":
                copilot_runs_claude_hooks(client, base)
            edits_checked(client, base)
            for transport in ("stdio", "http"):
                mcp_round_trip(client, base, transport)
            if client.name == "claude":
                asks_a_person(client, base)
            shown_to_person(client, base)
    finally:
        left = LEFT_BEHIND + sweep(base)
        check("no client or hook process outlives its session", not left, left)
        shutil.rmtree(base, ignore_errors=True)
        note(f"clients run took {time.monotonic() - started:.0f}s")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
