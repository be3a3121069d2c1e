VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install test fuzz docs demo bench gpu-check wheels clean

# The PyPI builds a GPU user installs (CUDA-enabled; they run on a machine without a GPU), pinned first so
# that the package's torch range resolves to them; the frameworks' tests need the matching torchvision.
TORCH ?= torch==2.14.1 torchvision==0.29.1
install:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test,docs]'

# Two workers, a file each at a time: most tests wait on trials that run in their own processes, and the
# tests are written to hold on a busy machine (each worker is the other's busy neighbour). With Python's
# bytecode cache on even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the suite starts some
# hundred Python processes (the CLI, zygotes, torchrun's ranks), each of which would compile the package anew,
# and each worker would rewrite every test module's asserts again (about 4 s). Files are handed out in the
# order tests/conftest.py gives them (longest first), not reordered by their number of tests.
test:
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The property-based tests of tests/test_analyze_fuzz.py (mutated traces, trial.json and session.json through
# `advisor analyze` and `advisor report`) with many more examples than `make test` runs (100 per property).
FUZZ_EXAMPLES ?= 4000
fuzz:
	ADVISOR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/test_analyze_fuzz.py \
		--hypothesis-show-statistics

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing page or an
# anchor that is not there fails the build. `make test` builds it too (tests/test_docs.py).
docs:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# runs/demo is the demo's own folder: each `make demo` starts it afresh (a session refuses a folder that holds one).
demo:
	rm -rf runs/demo
	$(VENV)/bin/advisor profile examples/image_classifier.py --device cpu --max-trials 8 --out runs/demo

bench:
	$(PY) benchmarks/run.py

# On a CUDA machine: doctor, the CUDA tests, two short sessions and a small grid, in at most 8 minutes; what to
# bring back lands in $(OUT) (at most 8 files of at most 16 MB). Without CUDA: "no CUDA device: nothing checked".
gpu-check:
	$(PY) benchmarks/gpu_check.py $(if $(OUT),--out $(OUT))

# This package's dependencies but torch, and the package itself, as wheels in $(WHEELS), for a GPU machine that
# has torch but no network (docs/gpu.md). timm is left out with torch and torchvision (it requires both:
# pip would fetch a torch); its tests are skipped where it is not installed. WHEELS_FOR targets another Python or platform, e.g.
# WHEELS_FOR="--python-version 3.10 --platform manylinux2014_x86_64 --only-binary=:all:".
WHEELS ?= wheels
WHEELS_FOR ?=
wheels:
	mkdir -p $(WHEELS)
	$(PY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		print('\n'.join(r for r in p['dependencies'] + p['optional-dependencies']['test'] \
		if not r.startswith(('torch', 'timm')) or r.startswith('torch-tb-profiler')))" > $(WHEELS)/requirements.txt
	$(PIP) download -q -d $(WHEELS) $(WHEELS_FOR) -r $(WHEELS)/requirements.txt "setuptools>=77" wheel
	$(PIP) wheel -q --no-deps -w $(WHEELS) .

clean:
	rm -rf $(VENV) build site *.egg-info
