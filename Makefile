VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install test demo bench clean

# torch==2.13.0 first: the CPU build on this machine's disk. A bare `torch` requirement could pull a
# multi-GB CUDA build; with 2.13.0 present the package's range is already satisfied.
install:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

test:
	$(PY) -m pytest -q

demo:
	$(VENV)/bin/advisor profile examples/image_classifier.py --device cpu --out runs/demo

bench:
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info
