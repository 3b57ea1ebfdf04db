# Two commands: `make demo` and `make test`. Both create .venv if missing and install
# every extra (`.[all,test]`: forecasters, the torch worker, Kafka, PostgreSQL, Prometheus).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
OUT ?= out

.PHONY: demo simulate test bench mutation chaos install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,test]'
	touch $(STAMP)

# The main job: the whole Airflow loop on the embedded default (about 10 minutes).
demo: $(STAMP)
	$(BIN)/kale demo --out $(OUT)/demo

# The decision engine on the bundled trace, with every baseline (about 15 seconds).
simulate: $(STAMP)
	$(BIN)/kale simulate --days 30 --json $(OUT)/simulate.json --plot $(OUT)/simulate.png

bench: $(STAMP)
	for b in engine downtime forecasting rebalance runtime autoscaler kafka; do $(BIN)/python benchmarks/$$b.py || exit 1; done

# Mutation testing of the critical modules, one at a time (2 to 45 minutes each, about 3 hours in
# all on 2 cores; benchmarks/mutation.py --modules for a few): benchmarks/results/mutation.json.
mutation: $(STAMP)
	$(BIN)/python benchmarks/mutation.py

# Fault drills on loopback servers (PostgreSQL and broker outages, concurrent applies, damaged
# checkpoints, an emptied broker, password masking; about 10 minutes): benchmarks/results/chaos.json.
chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py

# The suite in TEST_WORKERS processes (pytest-xdist; each test file stays in one of them, with
# its own servers on free ports). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) $(OUT)
