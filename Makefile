# The two commands: `make test` and `make demo` (each creates .venv first when missing).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: env jars classes test test-all demo demo-cluster ui screenshots lint clean-demo instance postgres chromium hosts-tools

env: $(STAMP) jars classes

# Delta's JVM jars (resources/delta_jars.py): Maven copies the ones resources/maven/pom.xml pins
# into the venv once, each checked against resources/maven/delta-jars.sha256; Spark sessions
# load them from there (nothing is fetched at run time)
jars: $(STAMP)
	@$(PY) -m resources.delta_jars fetch

# the driver JVM's class archive (resources/class_archive.py): every later Spark session of this
# venv starts ~4 s sooner and runs its first job ~2 s sooner; built once per pyspark version
classes: $(STAMP) jars
	@$(PY) -m resources.class_archive_build

# the project's Dagster instance config (run monitoring, see deploy/dagster.yaml) in DAGSTER_HOME:
# not in the repository root, where `dagster dev` would warn at every `make ui` that a
# dagster.yaml in the current folder is not used
instance: $(DAGSTER_HOME)/dagster.yaml

$(DAGSTER_HOME)/dagster.yaml: deploy/dagster.yaml
	@mkdir -p $(DAGSTER_HOME)
	cp deploy/dagster.yaml $@

# BACKFILL_SHARED_VENV=1: a venv shared with another checkout is never reinstalled from this
# one (tests/test_readme.py runs the README's blocks in a copy of the tree with the venv linked)
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$$BACKFILL_SHARED_VENV" ]; then echo "shared venv: not reinstalled"; else \
		echo "installing the project and its dependencies into $(VENV) (a few minutes on a" \
			"fresh clone; pip shows each package as it goes)"; \
		$(PY) -m pip install -e '.[dev]' && touch $(STAMP); fi

# 2 worker processes (pytest-xdist), each with its own Spark session and, when its tests need
# them, its own standalone cluster, Connect server and S3 server, on ports of its own block
# (tests/infra/procs.py). --dist load: xdist's loadgroup does not group under pytest 9.2 (its
# node-id suffix is ignored), so nothing relies on grouping. --maxschedchunk 1: a worker is
# handed tests two at a time as it frees up; by default each worker first gets a quarter of
# its share in collection order, and the slow tests (sorted first) all went to one worker.
# PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
PYTEST_XDIST = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist load \
	--maxschedchunk 1) \
	--durations=60

test: env instance postgres chromium hosts-tools
	$(PY) -m pytest $(PYTEST_XDIST)

# everything but the soak: also the core scenarios' variants in the non-default modes (crash
# matrix and races of arrangement / no_shuffle, no_shuffle e2e, the short soak); ~25 min more
test-all: env instance postgres chromium hosts-tools
	$(PY) -m pytest $(PYTEST_XDIST) -m "not soak"

# PostgreSQL server binaries for the Postgres-backed Dagster test (tests/scale): Debian's
# package, installed only where missing (the test starts its own server on 127.0.0.1)
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# ip, ss (iproute2) and unshare, nsenter (util-linux) for the host tests' network and mount
# namespaces (tests/infra/hosts.py), installed only where missing like postgres
hosts-tools:
	@{ command -v ip && command -v ss; } >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; }
	@{ command -v unshare && command -v nsenter; } >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux; }

# Debian's Chromium for the browser test (tests/test_browser.py) and `make screenshots`,
# installed only where missing like postgres; Playwright drives it (never `playwright install`)
chromium:
	@command -v chromium >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

demo: env instance
	$(PY) -m jobs.demo

# the demo on a local standalone Spark cluster with every table on a local S3-compatible server
# (moto); both are started on 127.0.0.1 and stopped by jobs/demo_cluster.py (DEMO_ROWS, 100000)
demo-cluster: env
	$(PY) -m jobs.demo_cluster

# `make demo` leaves its settings (warehouse, vnode count, its folder of MV definitions
# jobs/configs/mvs) in $(DEMO_ENV): the UI then serves the demo's five MVs, a group each.
# Without that file the UI serves the defaults (./warehouse, the one MV of jobs/configs/mv.yaml).
DEMO_ENV ?= $(CURDIR)/demo.env
UI_HOST ?= 127.0.0.1
UI_PORT ?= 3000

ui: env instance
	@if [ -f "$(DEMO_ENV)" ]; then echo "serving the demo's platform ($(DEMO_ENV))"; fi
	set -a; if [ -f "$(DEMO_ENV)" ]; then . "$(DEMO_ENV)"; fi; set +a; \
		exec $(PY) -m dagster dev -w workspace.yaml -h $(UI_HOST) -p $(UI_PORT)

# screenshots of the main views for README/docs (needs Debian's `chromium`; not used by CI)
screenshots: env chromium
	$(PY) -m docs.screenshots.take

lint: env
	$(PY) -m ruff check backfill_assets resources jobs tests benchmarks docs

clean-demo:
	rm -rf warehouse .dagster_home $(DEMO_ENV)

# ---------------------------------------------------------------------------- benchmarks
# docs/BENCHMARKS.md has the figures and what each target measures. Every Spark workload runs
# under `flock $(BENCH_LOCK)` (the drivers lock each fresh worker process; bench-latency locks
# itself whole), so figures are never taken while another Spark job runs.
BENCH_LOCK ?= /tmp/spark.lock
BENCH_ROWS ?= 1000000 5000000
BENCH_PK ?= single composite
BENCH_INC_ROWS ?= 5000000
BENCH_CROSSOVER_ROWS ?= 5000000
BENCH_SCALE_ROWS ?= 1000000
BENCH_PROFILE_ROWS ?= 5000000
BENCH_QUICK_ROWS ?= 100000
BENCH_SCALE_OUT_ROWS ?= 100000000
BENCH_SCALE_OUT_DML ?= --dml-kind inserts --catch-up-batches 5
BENCH_BASELINE_ROWS ?= 5000000
BENCH_ARGS ?=
export BENCH_LOCK

.PHONY: bench bench-bulk bench-bulk-20m bench-bulk-100m bench-incremental bench-crossover \
	bench-change-floor \
	bench-latency bench-scaling bench-profile \
	bench-upstream bench-quick bench-scale-out bench-baselines bench-baselines-refresh \
	bench-baselines-streaming bench-join

bench: bench-bulk bench-bulk-20m bench-incremental bench-scaling bench-profile bench-latency

bench-bulk: env
	$(PY) -m benchmarks.bench_bulk --rows $(BENCH_ROWS) --pk $(BENCH_PK) $(BENCH_ARGS)

# 20M rows: about 50 min on 2 cores; its own results file (bench-scaling reads both)
bench-bulk-20m: env
	$(PY) -m benchmarks.bench_bulk --rows 20000000 --pk $(BENCH_PK) --budget 1800 \
		--name bulk_20M $(BENCH_ARGS)

# 100M rows, snapshot mode only (the chunked modes take hours at this size), one repeat of
# each baseline; its own results file
# the worker alone runs about an hour on this 2-core machine (the writer's 20 versions of
# 10,000 changes take ~150 s each): more than the default worker timeout of 40 minutes
bench-bulk-100m: env
	BENCH_WORKER_TIMEOUT=$${BENCH_WORKER_TIMEOUT:-7200} $(PY) -m benchmarks.bench_bulk --rows 100000000 --pk single --modes snapshot --repeat 1 --verify \
		--budget 0 --name bulk_100M $(BENCH_ARGS)

bench-incremental: env
	$(PY) -m benchmarks.bench_incremental --rows $(BENCH_INC_ROWS) $(BENCH_ARGS)

# one barrier of 1% / 10% / 30% changed rows forced to apply, forced to re-snapshot, and by
# cost (issue 38): results/crossover_<rows>.json
bench-crossover: env
	$(PY) -m benchmarks.bench_crossover --rows $(BENCH_CROSSOVER_ROWS) $(BENCH_ARGS)

# one DML commit's change files (256) read each way a reader could, beside the storage
# layer's read of the range: the floor under a small barrier's change read (issue 38)
bench-change-floor: env
	$(PY) -m benchmarks.change_read_floor $(BENCH_ARGS)

bench-scaling: env
	$(PY) -m benchmarks.bench_scaling --rows $(BENCH_SCALE_ROWS) $(BENCH_ARGS)

bench-profile: env
	$(PY) -m benchmarks.bench_profile --rows $(BENCH_PROFILE_ROWS) $(BENCH_ARGS)

bench-latency: env
	flock $(BENCH_LOCK) $(PY) -m benchmarks.bench_latency $(BENCH_ARGS)

# snapshot mode on a loopback standalone cluster with every table on a local S3 server (moto,
# in memory: ~10 GB at 100M rows), with bench-bulk's baselines measured the same way
bench-scale-out: env
	$(PY) -m benchmarks.bench_scale_out --rows $(BENCH_SCALE_OUT_ROWS) $(BENCH_SCALE_OUT_DML) $(BENCH_ARGS)

bench-upstream: env
	$(PY) -m benchmarks.bench_upstream $(BENCH_ARGS)

# issue 38: our figures and what a Delta user runs instead, in one run (the snapshot backfill,
# barriers and the follower's latency against the delta-spark full refresh, the Structured
# Streaming MERGE pattern and the machine's floors) -> vs_baselines.json. The drivers lock each
# worker; run whole under `flock $(BENCH_LOCK)`, they notice it and take no lock of their own.
bench-baselines: env
	$(PY) -m benchmarks.bench_vs_baselines --rows $(BENCH_BASELINE_ROWS) $(BENCH_ARGS)

# the baselines alone: (a) delta-spark full refresh + (c) pyarrow / plain JVM Spark copies
bench-baselines-refresh: env
	$(PY) -m benchmarks.baseline_delta_spark --rows $(BENCH_BASELINE_ROWS) $(BENCH_ARGS)

# (b) the Structured Streaming pattern: change-set cost and commit-to-MV latency
bench-baselines-streaming: env
	$(PY) -m benchmarks.baseline_streaming --rows $(BENCH_BASELINE_ROWS) $(BENCH_ARGS)

# issue 50: a join MV (20M orders x 1M customers, aggregated per region and day) against
# Spark Declarative Pipelines and the delta-spark recompute, in one run -> results/join_20M.json
bench-join: env
	$(PY) -m benchmarks.bench_join $(BENCH_ARGS)

# CI-sized run of every benchmark (100k rows; results under benchmarks/results/*_quick.json)
bench-quick: env
	$(PY) -m benchmarks.bench_bulk --rows $(BENCH_QUICK_ROWS) --repeat 1 --name bulk_quick
	$(PY) -m benchmarks.bench_incremental --rows $(BENCH_QUICK_ROWS) --repeat 1 \
		--name incremental_quick
	$(PY) -m benchmarks.bench_scaling --rows $(BENCH_QUICK_ROWS) --repeat 1 \
		--bulk benchmarks/results/bulk_quick.json --name scaling_quick
	$(PY) -m benchmarks.bench_profile --rows $(BENCH_QUICK_ROWS) --repeat 1 --name profile_quick
	flock $(BENCH_LOCK) $(PY) -m benchmarks.bench_latency --rows $(BENCH_QUICK_ROWS) \
		--vnodes 16 --intervals 5 --commits 5 --max-seconds 240 --name latency_quick

# ---------------------------------------------------------------------------- reliability
# The long randomized soak (docs/RELIABILITY.md): SOAK_SECONDS of random DML, barriers,
# controls, rescales and kills, the invariant checked after every commit. Spark runs at
# local[1] (BACKFILL_SPARK_MASTER overrides) so it can share the box; the figures are printed
# ("SOAK FIGURES ...") and written to SOAK_REPORT. CI runs the short version in `make test`.
SOAK_SECONDS ?= 1800
SOAK_SEED ?= 7
SOAK_REPORT ?= $(CURDIR)/docs/soak_last_run.json

.PHONY: soak
soak: env
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_SEED=$(SOAK_SEED) SOAK_REPORT=$(SOAK_REPORT) \
	BACKFILL_SPARK_MASTER=$${BACKFILL_SPARK_MASTER:-local[1]} \
		$(PY) -m pytest tests/reliability/test_soak.py -m soak -s -q -p no:cacheprovider
