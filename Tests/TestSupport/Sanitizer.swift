import Foundation

/// True when `make test-sanitize` runs the suite under AddressSanitizer. ASan holds freed memory in quarantine
/// (256 MiB) to catch a use after free and adds shadow memory and redzones, so a process's RSS says nothing about
/// the code under test there: tests that bound RSS skip only that assertion.
public let rssBoundsMeaningless = ProcessInfo.processInfo.environment["JOBSERVER_SANITIZER"] == "address"
