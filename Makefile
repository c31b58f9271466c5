# The two commands: `make demo` (swarl's main job on its embedded default) and `make test`.
.PHONY: setup demo demo-learning learning-seeds test long chaos images fuzz lint bench bench-async bench-async-repeats gpu-wheels clean

setup:
	@bash scripts/setup.sh

# seed 0 of the learning proof's design (benchmarks/demo_learning.py DESIGN) at 18 learner steps, with the
# SFT control; ends with the held-out change and its interval
demo: setup
	.venv/bin/swarl demo $(ARGS)

# does the demo learn to read? per seed (0-4) the RL run with its SFT control and the shuffled-reward run,
# 18 learner steps an arm (2 passes over each batch) from the warm start with reading demonstrations
# (benchmarks/demo_learning.py DESIGN); writes benchmarks/demo_learning.{json,png} and docs/demo.md's
# "Measured" section. ~35 min a seed on 2 cores (docs/demo.md "The design since 8459ac9"); ARGS="--seeds 0,1" to shorten,
# ARGS="--from-run runs/X" to record seeds already run
demo-learning: setup
	.venv/bin/python benchmarks/demo_learning.py $(ARGS)

# does the loop learn? the reading task (swarl learning-check) with the default settings and the
# shuffled-reward control over five seeds (make test runs one seed of both: tests/system/test_loop_learns.py)
learning-seeds: setup
	.venv/bin/python benchmarks/learner_settings.py --only "the check's default,shuffled-reward control at" --seeds 0,1,2,3,4 --no-record $(ARGS)

test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal --durations=15 $(ARGS)

# the whole-system runs of several minutes (marker `long`): the tiny-model whole loop, the quick
# async-vs-sync benchmark, every bundled task graded under the reward-hack defences, the demo's
# two-arm --seeds run
long: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m long tests $(ARGS)

# fault injection on live runs (tests/chaos, marker `chaos`; `make test` runs only their fast checks)
chaos: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m chaos tests/chaos $(ARGS)

# task images through a real registry at full size (marker `registry`; `make test` runs the
# same paths with tiny images: tests/envd/test_image_registry.py)
images: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m registry tests/envd $(ARGS)

# bad input from schemas and strategies (marker `fuzz`): `make test` runs them with a few examples
# each (SWARL_FUZZ_EXAMPLES=10), this runs them with many more
fuzz: setup
	SWARL_FUZZ_EXAMPLES=$${SWARL_FUZZ_EXAMPLES:-300} .venv/bin/python -m pytest -q -p no:cacheprovider -m fuzz tests $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports

# every benchmark but the GPU check (it needs a CUDA device; its CPU form runs in make test)
bench: setup
	for b in benchmarks/*.py; do case $$b in benchmarks/gpu_check.py|benchmarks/_record.py|benchmarks/demo_runs_compare.py) ;; \
		*) .venv/bin/python $$b || exit 1;; esac; done  # the GPU check needs CUDA; the other two are helpers

# the wheels the GPU check carries to the GPU machine (what its image lacks: megatron-core, pydantic,
# redis, ...; cp312 manylinux, under 60 MB) into .gpu-wheels/, ignored by git (docs/gpu.md)
gpu-wheels: setup
	.venv/bin/python benchmarks/gpu_check.py --wheels .gpu-wheels --python-version 3.12

# asynchronous vs synchronous on swarl itself (~45 min; ARGS="--minutes 3" to shorten)
bench-async: setup
	.venv/bin/python benchmarks/async_vs_sync.py $(ARGS)

# max_staleness 0 against 2, three runs: the spread between runs and the mean with an interval
# (~15 min a run; ARGS="--runs 5")
bench-async-repeats: setup
	.venv/bin/python benchmarks/async_vs_sync_repeats.py $(ARGS)

clean:
	rm -rf .swarl runs
