SHELL := /bin/bash
.PHONY: all build run test test-sanitize fuzz bench clean

all: build

build:
	@scripts/ensure-deps.sh build
	scripts/build-without-warnings.sh

run:
	@scripts/ensure-deps.sh build
	swift build -c release
	.build/release/jobserver serve

test:
	@scripts/ensure-deps.sh test
	scripts/build-without-warnings.sh --build-tests
	swift test --disable-swift-testing
	scripts/check-openapi.sh
	Tests/Integration/run.sh

# The XCTest suite under ThreadSanitizer, then AddressSanitizer; fails on any report.
test-sanitize:
	@scripts/ensure-deps.sh test
	scripts/test-sanitize.sh

# schemathesis with every check and the stateful phase, longer than make test's bounded run.
fuzz:
	@scripts/ensure-deps.sh test
	swift build
	SCHEMATHESIS_MAX_EXAMPLES=200 SCHEMATHESIS_TIME_LIMIT=1800 Tests/Integration/conformance.test.sh

bench:
	@scripts/ensure-deps.sh bench
	swift build -c release
	bench/run.sh

clean:
	rm -rf .build
