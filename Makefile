# Two commands: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= out

.PHONY: demo test bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# Until the Airflow loop lands, the main job is the simulator on the bundled trace.
demo: $(STAMP)
	$(BIN)/kale simulate --days 30 --json $(OUT)/simulate.json --plot $(OUT)/simulate.png
	@echo "demo: results in $(OUT)/simulate.json, plot in $(OUT)/simulate.png"

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(OUT)
