SHELL := /bin/bash
.PHONY: all build run test bench clean

all: build

build:
	@scripts/ensure-deps.sh build
	swift build

run:
	@scripts/ensure-deps.sh build
	swift build -c release
	.build/release/jobserver serve

test:
	@scripts/ensure-deps.sh test
	swift build --build-tests
	swift test --disable-swift-testing
	scripts/check-openapi.sh
	Tests/Integration/run.sh

bench:
	@scripts/ensure-deps.sh bench
	swift build -c release
	bench/run.sh

clean:
	rm -rf .build
