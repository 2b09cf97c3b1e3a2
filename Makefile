# Quick start: `make demo` then `make test`. Both install what they need into .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-slow lint typecheck sshd-deps bytecode clean

# The editable install in "compat" mode puts the checkout on sys.path with a .pth
# line; the default mode imports a finder module at every interpreter start, which
# doubled the start of each of the hundreds of processes the tests run (47 -> 20 ms).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e '.[torch,tf,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

install: $(STAMP)

# Integration tests start a real OpenSSH sshd and drive `dtlaunch status` in tmux;
# install them when missing and we may.
sshd-deps:
	@if [ ! -x /usr/sbin/sshd ] || ! command -v tmux >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing openssh-server and tmux (needed by the sshd fixture and the status tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client tmux >/dev/null; \
	  else \
	    echo "openssh-server or tmux is missing; install them (apt-get install openssh-server tmux) to run the SSH and status tests"; \
	  fi; \
	fi

# Compiled bytecode for dtlaunch, written ahead: with PYTHONDONTWRITEBYTECODE set
# (as on the CI machines) every agent, worker and CLI the tests start would compile
# the package from source again, ~0.8 s of CPU each. Only stale files are compiled.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q dtlaunch

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: lint

# Two test processes, one per core of the reference machine; every test owns its
# ports, run dirs and network namespaces, so they may run side by side. The 25
# slowest are listed at the end: the suite's budget is ~12 minutes on 2 cores.
TEST_PROCESSES ?= 2

test: $(STAMP) sshd-deps lint bytecode
	$(BIN)/pytest -m "not slow" -q -n $(TEST_PROCESSES) --dist worksteal --durations=25

test-slow: $(STAMP) sshd-deps bytecode
	$(BIN)/pytest -m slow -q

# The same job twice, a worker 3x slower: plain BSP, then --policy nd; a comparison at the end.
demo: $(STAMP) bytecode
	$(BIN)/python examples/demo.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
