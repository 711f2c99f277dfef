#if canImport(Glibc)
import Glibc
#endif

/// Asks the kernel to back a large buffer that is about to be written with transparent huge pages.
///
/// A large answer is written into fresh memory, and every 4 KiB page of it is faulted in and cleared on first touch:
/// for the 142 MB answer of a job of 100,000 fetches, page faults took most of the time its writing took (`perf`: 374
/// of 613 samples of the writing thread in `exc_page_fault`, 304 in `clear_page_erms`). Advised, the buffer is
/// faulted in 2 MiB at a time. The kernel does so where `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or
/// `madvise` (Debian's default); elsewhere the advice is ignored.
enum HugePages {
    /// Buffers smaller than this are left alone: they are few pages, often reused from the allocator's free lists.
    static let minBytes = 4 << 20
    private static let size = 2 << 20

    /// Advises the whole 2 MiB pages within `count` bytes from `base`.
    static func advise(_ base: UnsafeMutableRawPointer?, count: Int) {
        #if canImport(Glibc)
        guard count >= minBytes, let base else { return }
        let start = (Int(bitPattern: base) + size - 1) & ~(size - 1)
        let end = (Int(bitPattern: base) + count) & ~(size - 1)
        guard end > start, let aligned = UnsafeMutableRawPointer(bitPattern: start) else { return }
        // Advice, not a need: a kernel without huge pages refuses it, and the buffer is written as before.
        _ = madvise(aligned, end - start, MADV_HUGEPAGE)
        #endif
    }
}
