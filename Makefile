# The front doors: `make demo` and `make test`. Both install what is missing (Debian 12, as root),
# configure with CMake presets and build with Ninja.
PRESET ?= release
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)
# Tests run this many at a time; most of them wait (long polls, graces, a stalled API), not compute.
TEST_JOBS ?= $(JOBS)

.PHONY: all deps build test test-asan test-tsan soak fuzz demo bench package packages repo test-packages clean \
        format format-check api-document

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt CMakePresets.json | deps
	cmake --preset $(PRESET)

build: deps $(BUILD)/build.ninja
	cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	ctest --preset $(PRESET) -j $(TEST_JOBS)

# docs/openapi.yaml as Stoplight Spectral and Prism read it (Node.js, the npm registry once):
# Spectral's OpenAPI rules, and Prism's validator over the integration tests' traffic.
api-document: build
	TEST_JOBS=$(TEST_JOBS) bash scripts/check-api-document.sh

# The sanitizers' tests mostly wait too, slower: twice as many at a time keeps CI short. The
# package's tests run in the release build only (a package of sanitized binaries shows nothing more).
test-asan:
	$(MAKE) test PRESET=asan TEST_JOBS=$$(( $(JOBS) * 2 ))

# The fuzzers (tests/fuzz, libFuzzer with ASan and UBSan): the asan preset builds them with clang and
# its tests run each for 60 s (label `fuzz`); `make fuzz` runs each for FUZZ_SECONDS, JOBS at a time,
# over a copy of its seed corpus under build/asan/fuzz-work, and prints executions and coverage.
FUZZ_SECONDS ?= 600
fuzz: deps
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS) --target fuzzers
	python3 tests/fuzz/fuzz.py all --build build/asan --seconds $(FUZZ_SECONDS) --jobs $(JOBS)

# ThreadSanitizer over the tests that run threads (label `threads`: the in-process daemon, the HTTP
# server, the reporter, metrics, the libvirt adapter, gpunodectl's client). The preset passes
# -Wno-tsan: GCC 12 warns that TSan cannot see the std::atomic_thread_fence Asio uses.
test-tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS) --target thread-tests
	ctest --preset tsan -j $(JOBS)

# The crash loop's long version (issue 15; `make test` runs its 50-kill short version): SOAK_KILLS
# SIGKILLs of the real agent with everything in flight, each restart checked (tests/soak/). With
# SOAK_MINUTES it stops killing once that many minutes have passed, and checks the end as usual.
SOAK_KILLS ?= 1000
SOAK_MINUTES ?=
soak: deps $(BUILD)/build.ninja
	cmake --build --preset $(PRESET) -j $(JOBS) --target gpunode-agent
	python3 tests/soak/soak_test.py $(BUILD)/gpunode-agent --kills $(SOAK_KILLS) $(if $(SOAK_MINUTES),--minutes $(SOAK_MINUTES))

# The demo runs gpunode-agent and prints gpunodectl commands: it builds those two only (not the
# tests and benchmarks `build` makes).
demo: deps $(BUILD)/build.ninja
	cmake --build --preset $(PRESET) -j $(JOBS) --target gpunode-agent gpunodectl
	@bash scripts/demo.sh $(BUILD)/gpunode-agent

# The Debian package from the build tree: build/<preset>/gpunode-agent_VERSION_ARCH.deb (and, from
# a build with debug information such as the release preset, the -dbgsym .ddeb beside it).
package: build
	cd $(BUILD) && cpack -G DEB

# The package for each Debian release (CONTRACT §14), each built in its release:
# build/packages/bookworm/ (V-1~deb12u1) and build/packages/trixie/ (V-1~deb13u1). This machine's
# release from its `release` preset build; the other in a cached build root of that release
# (mmdebstrap, then systemd-nspawn without network: scripts/packages.py). Needs root.
packages:
	$(MAKE) build PRESET=release
	python3 scripts/packages.py . build/release build/packages --jobs $(JOBS)

# A static apt repository of what `make packages` left (CONTRACT §14): build/repo/ with
# dists/bookworm and dists/trixie (component main), pool/, InRelease and Release.gpg, and the key's
# public half gpunode-archive-keyring.gpg, made by reprepro from the packages alone
# (scripts/repo.py). Signed with REPO_KEY (a secret key of your GnuPG keyring), else with a key made
# for the purpose and kept in repo-key/ (outside build/: `make clean` keeps it, as every host
# trusts its public half).
REPO_KEY ?=
repo: deps
	python3 scripts/repo.py build/packages build/repo --key-home repo-key $(if $(REPO_KEY),--key '$(REPO_KEY)')

# What `make packages` and `make repo` left, proven on each release (tests/packaging/test_packages.py):
# contents and lintian in the release's own build root, the maintainer scripts, the real-systemd
# test booted on that release (on trixie also the upgrade from the bookworm package), and the
# repository added, installed from and upgraded from (a newer one built by the test, signed by the
# same key). Needs root.
test-packages:
	python3 tests/packaging/test_packages.py . build/packages --repo build/repo --build build/release \
	  --key-home repo-key --jobs $(JOBS) $(if $(REPO_KEY),--key '$(REPO_KEY)')

bench: build
	@bash scripts/install-deps.sh bench
	cmake --build --preset $(PRESET) -j $(JOBS) --target benchmarks
	@bash tests/bench/run.sh $(BUILD)

# The C++ sources as the repo's .clang-format says (clang-format 14, Debian 12's): `make format`
# rewrites them; `make format-check` (run by .ci/run) lists any that differ and fails.
format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

format-check: deps
	@bad=$$(for f in $$(git ls-files '*.cpp' '*.hpp'); do clang-format --dry-run -Werror "$$f" >/dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$bad" ]; then echo "not formatted (run make format):"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	echo "format-check: $$(git ls-files '*.cpp' '*.hpp' | wc -l) files formatted"

clean:
	rm -rf build
