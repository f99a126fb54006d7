# Entry points named in README: `make demo` (set-up, build, the main job: opforge train) and
# `make test` (set-up, build, every test). Both install missing Debian packages first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench clean format

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Every test, then the runtime's own tests again under ASan+UBSan and TSan (scripts/sanitizer-tests.sh).
test: build
	@cd $(BUILD) && ctest -j $(JOBS) --output-on-failure --timeout 900
	@JOBS=$(JOBS) scripts/sanitizer-tests.sh $(BUILD)

# The main job: an MLP trained on Fashion-MNIST (opforge train's defaults), its run folder printed.
demo: build
	$(BUILD)/bin/opforge train

bench: build
	$(BUILD)/bin/opforge bench

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
