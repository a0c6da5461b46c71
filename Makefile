# The front doors: `make demo` and `make test`. Both install what is missing (Debian 12, as root),
# configure with CMake presets and build with Ninja.
PRESET ?= release
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)

.PHONY: all deps build test test-asan test-tsan demo bench clean format

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt CMakePresets.json | deps
	cmake --preset $(PRESET)

build: deps $(BUILD)/build.ninja
	cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	ctest --preset $(PRESET) -j $(JOBS)

test-asan:
	$(MAKE) test PRESET=asan

# ThreadSanitizer over the unit tests and the in-process daemon tests (label `unit`). The preset
# passes -Wno-tsan: GCC 12 warns that TSan cannot see the std::atomic_thread_fence Asio uses.
test-tsan:
	$(MAKE) test PRESET=tsan

demo: build
	@bash scripts/demo.sh $(BUILD)/gpunode-agent

bench: build
	@bash tests/bench/run.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf build
