# lmscale entry points (README.md):
#   make          configure + build (build/lmscale)
#   make run      build, then run the default deck inputs/quickstart.ini on CPU through mpirun
#   make test     build, then ctest (unit, mpi, regression, slurm, analysis; gpu tests skip without a GPU)
#   make deps     install the Debian/Python packages the above need (run and test call it)
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
RANKS      ?= 2
MPIRUN     ?= mpirun --oversubscribe --allow-run-as-root --bind-to none
CTEST_ARGS ?=
LAUNCHER   := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

.PHONY: all build configure deps run test docs clean

all: build

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_ARGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@scripts/deps/install.sh

run: deps
	@$(MAKE) --no-print-directory build
	@mkdir -p outputs
	OMPI_MCA_btl_vader_single_copy_mechanism=none $(MPIRUN) -np $(RANKS) $(BUILD)/lmscale inputs/quickstart.ini
	@echo "output: outputs/quickstart.h5"

test: deps
	@$(MAKE) --no-print-directory build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# Regenerates docs/deck.md from the key table (a unit test checks it is current).
docs: build
	$(BUILD)/lmscale --help-markdown > docs/deck.md

clean:
	rm -rf $(BUILD)
