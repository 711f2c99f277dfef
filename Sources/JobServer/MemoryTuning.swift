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
enum MemoryTuning {
    /// The size from which a block is mapped on its own: glibc's own first value, kept from moving.
    static let mmapThresholdBytes: Int32 = 128 * 1024
    /// `M_MMAP_THRESHOLD` of `<malloc.h>`, which the Glibc module does not bring in.
    private static let mmapThresholdOption: Int32 = -3

    /// Call once, before the server allocates much. Does nothing where `mallopt` is not found (not glibc).
    static func apply() {
        #if canImport(Glibc)
        // Looked up rather than declared: no C module of the project includes <malloc.h>. A null handle is
        // RTLD_DEFAULT, the process's own symbols.
        guard let symbol = dlsym(nil, "mallopt") else { return }
        typealias Mallopt = @convention(c) (Int32, Int32) -> Int32
        _ = unsafeBitCast(symbol, to: Mallopt.self)(mmapThresholdOption, mmapThresholdBytes)
        #endif
    }
}
