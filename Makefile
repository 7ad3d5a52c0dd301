# Thin wrappers around CMake. `make run` and `make test` install what is
# missing (scripts/deps.sh), configure, build, then start or test.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
EMU_BUILD  ?= build-cuda-emu
# The tests that run threads of their own: the CPU kernels' pool, the
# engine on it, the scheduler thread, metrics updated from many threads.
# test_engine_kv16 is left out: its threads are the engine's, which
# test_engine_batch runs with a 16-bit cache too, and under TSan it took
# 100 s, the stage's longest by far.
TSAN_TESTS ?= kernels_cpu|engine_(batch|reference|prefix|backend)|scheduler_|metrics_threads|worker_lifecycle
JOBS       ?= $(shell nproc)
# ctest -j for the tests not labelled "timing": most of them wait on sockets
# and child processes (at -j2 the suite keeps 2 cores about a third busy),
# so twice the cores. The timing tests run at JOBS.
TEST_JOBS  ?= $(shell echo $$(( $$(nproc) * 2 )))
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 60
ARGS       ?=
CTEST_ARGS ?=

.PHONY: all deps build run test test-asan test-tsan test-cuda-emu bench soak-asan fuzz format clean

all: build

deps:
	@scripts/deps.sh build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/infergate serve $(ARGS)

test:
	@scripts/deps.sh test
	@[ -f $(BUILD)/CMakeCache.txt ] || cmake -S . -B $(BUILD) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && { { ctest --output-on-failure -j $(TEST_JOBS) -LE timing $(CTEST_ARGS) && \
	    ctest --output-on-failure -j $(JOBS) -L timing $(CTEST_ARGS); } || $(CURDIR)/scripts/retry-timing.sh; }

# The whole suite again under AddressSanitizer and UndefinedBehaviorSanitizer.
# CUDA stays off here: the sanitizers do not see into device code anyway.
test-asan:
	@scripts/deps.sh test
	@[ -f $(ASAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_BUILD) -DIG_ASAN=ON -DIG_UBSAN=ON -DIG_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && export ASAN_OPTIONS=detect_leaks=1 && \
	    ctest --output-on-failure -j $(TEST_JOBS) -LE timing $(CTEST_ARGS) && \
	    ctest --output-on-failure -j $(JOBS) -L timing $(CTEST_ARGS)

# The threaded tests under ThreadSanitizer. CUDA and OpenBLAS stay off: TSan
# cannot see into device code or into OpenBLAS's uninstrumented threads.
# Only the tests named by TSAN_TESTS (and what they need) are built.
test-tsan:
	@scripts/deps.sh test
	@[ -f $(TSAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(TSAN_BUILD) -DIG_TSAN=ON -DIG_CUDA=OFF -DIG_OPENBLAS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target infergate $$(cd $(TSAN_BUILD) && ctest -N -R '$(TSAN_TESTS)' | sed -n 's/^ *Test *#[0-9]*: //p')
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 exitcode=66 $(TSAN_OPTIONS)" ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)' $(CTEST_ARGS)

# The CUDA backend over the CPU emulation (docs/gpu.md), under ASan + UBSan:
# no GPU, no nvcc. Only the tests labelled cuda-emu and what they need are built.
EMU_TARGETS = infergate gpubench test_cuda_kernels test_cuda_model test_cuda_gpubench test_cuda_device
test-cuda-emu:
	@scripts/deps.sh test
	@[ -f $(EMU_BUILD)/CMakeCache.txt ] || cmake -S . -B $(EMU_BUILD) -DIG_WERROR=ON -DIG_CUDA=OFF -DIG_CUDA_EMU=ON -DIG_ASAN=ON -DIG_UBSAN=ON -DIG_OPENBLAS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)
	cmake --build $(EMU_BUILD) -j $(JOBS) --target $(EMU_TARGETS)
	cd $(EMU_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L cuda-emu $(CTEST_ARGS)

bench:
	@scripts/deps.sh bench
	@[ -f $(BUILD)/CMakeCache.txt ] || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
	bench/run-all.sh $(BUILD)

# bench/soak.sh once more against the ASan + UBSan build: any sanitizer report
# of the gateway or its workers fails it. The unoptimised build serves far
# less, so the load is lower and a request may take longer before it counts as hung.
soak-asan:
	@scripts/deps.sh test
	@[ -f $(ASAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_BUILD) -DIG_ASAN=ON -DIG_UBSAN=ON -DIG_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target infergate
	ASAN=1 RATE=$${RATE:-4} TIMEOUT_S=$${TIMEOUT_S:-120} bench/soak.sh $(ASAN_BUILD)

# Both fuzz targets for FUZZ_SECONDS each, side by side (one a core); a
# crash, leak or sanitizer report stops with a non-zero status, prints that
# target's log (fuzz-corpus/NAME.log) and leaves the input in fuzz-corpus/.
FUZZ_TARGETS = http api
fuzz:
	@scripts/deps.sh test
	@[ -f $(FUZZ_BUILD)/CMakeCache.txt ] || CC=clang cmake -S . -B $(FUZZ_BUILD) -DIG_FUZZ=ON -DIG_CUDA=OFF -DIG_OPENBLAS=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS:%=fuzz_%_request)
	@mkdir -p $(FUZZ_TARGETS:%=fuzz-corpus/%)
	@pids=""; \
	for t in $(FUZZ_TARGETS); do \
	    $(FUZZ_BUILD)/fuzz_$${t}_request -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=fuzz-corpus/$$t- \
	        fuzz-corpus/$$t tests/fuzz/corpus/$$t >fuzz-corpus/$$t.log 2>&1 & \
	    pids="$$pids $$!"; \
	done; \
	failed=0; \
	for p in $$pids; do \
	    wait $$p || failed=1; \
	done; \
	for t in $(FUZZ_TARGETS); do \
	    if grep -q "^Done [0-9]* runs" fuzz-corpus/$$t.log; then \
	        echo "fuzz_$${t}_request: $$(grep '^Done [0-9]* runs' fuzz-corpus/$$t.log)"; \
	    else \
	        failed=1; echo "fuzz_$${t}_request FAILED:"; tail -n 60 fuzz-corpus/$$t.log; \
	    fi; \
	done; \
	exit $$failed

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(TSAN_BUILD) $(EMU_BUILD)
