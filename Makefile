# Two commands: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= out

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kale simulate --json $(OUT)/simulate.json --plot $(OUT)/simulate.png

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(OUT)
