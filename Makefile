# keng — the two commands a newcomer needs:
#   make test    install dependencies, build (CUDA too when nvcc exists), run every test
#   make bench   install dependencies, build, run the benchmark entry point
# Other targets: setup (Debian packages only), build, install PREFIX=..., clean.

BUILD   ?= build
PREFIX  ?= /usr/local
CMAKE_FLAGS ?=
DEPS = cmake ninja-build pkg-config liblua5.4-dev lua5.4 lua-busted lua-filesystem \
       libopenblas-openmp-dev libreadline-dev util-linux libpng-dev libjpeg62-turbo-dev \
       libopenmpi-dev openmpi-bin

.PHONY: setup build test bench demo install clean

setup:
	@missing=""; for p in $(DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	ninja -C $(BUILD)

test: build
	bash tests/run_all.sh $(BUILD)

bench: build
	@if [ -f scripts/bench/all.lua ]; then ./$(BUILD)/keng scripts/bench/all.lua $(ARGS); \
	else ./$(BUILD)/keng scripts/demo.lua $(ARGS); fi

demo: build
	./$(BUILD)/keng scripts/demo.lua

install: build
	ninja -C $(BUILD) install

clean:
	rm -rf $(BUILD)
