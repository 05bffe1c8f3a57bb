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
	rm -rf __pycache__ .pytest_cache
