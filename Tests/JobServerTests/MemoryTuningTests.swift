import XCTest

@testable import JobServer

final class MemoryTuningTests: XCTestCase {
    func testTheArenasAreBoundedByTheCoresTwoAtLeast() {
        XCTAssertEqual(MemoryTuning.arenaMax(cores: 1), 2)
        XCTAssertEqual(MemoryTuning.arenaMax(cores: 2), 2)
        XCTAssertEqual(MemoryTuning.arenaMax(cores: 64), 64)
    }

    func testArenasSetByTheEnvironmentAreLeftToRule() {
        XCTAssertFalse(MemoryTuning.environmentSetsArenas([:]))
        XCTAssertFalse(MemoryTuning.environmentSetsArenas(["GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"]))
        XCTAssertTrue(MemoryTuning.environmentSetsArenas(["MALLOC_ARENA_MAX": "8"]))
        XCTAssertTrue(MemoryTuning.environmentSetsArenas(["GLIBC_TUNABLES": "glibc.malloc.arena_max=4"]))
    }
}
