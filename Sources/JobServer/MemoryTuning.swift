import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// How the server asks the C allocator to give memory back.
///
/// glibc serves a large allocation (128 KiB and up, at first) with its own `mmap`, unmapped when freed; but each
/// time such a block is freed it raises that threshold to the block's size (up to 32 MiB), so that from then on
/// response bodies, parsed results and the rows written for them come from the heap, which keeps what is freed:
/// measured with four jobs of 10 MB responses (`bench/85-memory.sh`), 547 MiB stayed resident after the jobs had
/// left memory, 94 MiB once `malloc_trim` had given the free part back. Setting the threshold fixes it where it starts, so a
/// big block goes back to the system as soon as it is freed (at the cost of an `mmap` per such block, which a
/// transfer of that size dwarfs).
///
/// glibc also gives each thread that meets a locked arena an arena of its own, up to eight per core. A job is parsed
/// on a submission thread, run on the engine's, fed by the fetcher's and written by the store's, so its memory is
/// spread over as many arenas, and what one arena frees the next job, built on another thread, does not reuse:
/// twenty jobs of 9,999 fetches submitted at once (with `--max-active-nodes` holding two in memory at a time)
/// peaked at 358–446 MiB with glibc's default and 253–295 MiB with one or two arenas (probes, `MALLOC_ARENA_MAX`).
/// So the arenas are bounded by the cores (two at least); glibc's per-thread caches still serve most small blocks
/// without a lock. `MALLOC_ARENA_MAX`, or an `arena_max` in `GLIBC_TUNABLES`, set by whoever starts the server,
/// is left to rule.
enum MemoryTuning {
    /// The size from which a block is mapped on its own: glibc's own first value, kept from moving.
    static let mmapThresholdBytes: Int32 = 128 * 1024
    /// `M_MMAP_THRESHOLD` and `M_ARENA_MAX` of `<malloc.h>`, which the Glibc module does not bring in.
    private static let mmapThresholdOption: Int32 = -3
    private static let arenaMaxOption: Int32 = -8

    /// The arenas glibc may make: one per core, two at least.
    static func arenaMax(cores: Int) -> Int32 {
        Int32(clamping: max(2, cores))
    }

    /// Whether the environment sets the number of arenas itself.
    static func environmentSetsArenas(_ environment: [String: String]) -> Bool {
        environment["MALLOC_ARENA_MAX"] != nil || (environment["GLIBC_TUNABLES"] ?? "").contains("arena_max")
    }

    /// Call once, before the server allocates much. Does nothing where `mallopt` is not found (not glibc).
    static func apply() {
        #if canImport(Glibc)
        // Looked up rather than declared: no C module of the project includes <malloc.h>. A null handle is
        // RTLD_DEFAULT, the process's own symbols.
        guard let symbol = dlsym(nil, "mallopt") else { return }
        typealias Mallopt = @convention(c) (Int32, Int32) -> Int32
        let mallopt = unsafeBitCast(symbol, to: Mallopt.self)
        _ = mallopt(mmapThresholdOption, mmapThresholdBytes)
        if !environmentSetsArenas(ProcessInfo.processInfo.environment) {
            _ = mallopt(arenaMaxOption, arenaMax(cores: ProcessInfo.processInfo.activeProcessorCount))
        }
        #endif
    }
}
