# The two commands README.md gives: `make demo` and `make test`. Both install the Debian
# packages the project needs first (tools/install-deps.sh), then configure and build.
JOBS ?= 2
BUILD ?= build
ASAN_BUILD ?= build-asan

.PHONY: all deps configure demo test test-fast test-asan clean

all: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash tools/install-deps.sh

demo: all
	@bash tools/demo_pipeline.sh $(BUILD)/pipedream

# The whole suite: a release build, then the same tests under ASan + UBSan but those labelled
# slow (CMakeLists.txt), which the release run covers.
test: all
	@bash tools/install-deps.sh --test
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-asan

# The release build's tests without the slow ones.
test-fast: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE slow

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPD_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# libFuzzer harnesses for every file parser (clang, ASan + UBSan); SECONDS per harness
# (default 60). See fuzz/run.sh.
.PHONY: fuzz
fuzz: deps
	@command -v clang >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -q clang >&2; } || \
	  { echo "pipedream: error: make fuzz needs clang: sudo apt-get install -y clang" >&2; exit 1; }
	bash fuzz/run.sh $(SECONDS)
