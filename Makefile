# README's two commands: `make run` (audit + probe on the built-in model) and `make test`.
# Everything is installed into a project-local virtual environment (.venv): the package names
# agent/, collectors/, tuning/ are generic and must never land in a shared site-packages.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hftagent-installed

.PHONY: run test venv apt-deps bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests use for real (promtool, prometheus, amtool; a C compiler for watch's
# native reader, agent/watch/sampling/native/hftsampler.c). Installed only when missing.
apt-deps:
	@pkgs=""; \
	if ! command -v promtool >/dev/null || ! command -v amtool >/dev/null; then pkgs="prometheus prometheus-alertmanager"; fi; \
	if ! command -v cc >/dev/null; then pkgs="$$pkgs gcc libc6-dev"; fi; \
	if [ -n "$$pkgs" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$pkgs >/dev/null; \
	  else echo "note: $$pkgs missing and cannot apt-get install them; those tests will skip" >&2; fi; \
	fi

# Main job: read-only audit of this host, then the probe on the built-in model.
# audit exits 2 when it finds something to fix; that is a report, not a failure of `make run`.
run: $(STAMP)
	$(BIN)/hftagent audit || [ $$? -eq 2 ]
	$(BIN)/hftagent probe

test: $(STAMP) apt-deps
	$(BIN)/python -m pytest -q

# The benchmarks behind docs/benchmarks.md that need no root and no tracefs (several minutes;
# run on a quiet machine). bench/README.md lists the others and their commands.
bench: $(STAMP)
	$(BIN)/python bench/audit_bench.py
	$(BIN)/python bench/probe_bench.py
	$(BIN)/python bench/scrape_bench.py
	$(BIN)/python bench/nvml_cost.py --fake
	$(BIN)/python bench/gate_bench.py
	$(BIN)/python bench/journal_bench.py --runs 3

lint: $(STAMP)
	$(BIN)/ruff check agent collectors tuning tests bench

clean:
	rm -rf $(VENV) build *.egg-info
