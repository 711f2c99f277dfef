#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a thread did not start: the `pthread_*` call and its error number.
public struct ThreadStartError: Error, CustomStringConvertible {
    public let call: String
    public let errno: Int32
    public var description: String { "\(call) failed (errno \(errno))" }
}

private final class ThreadBody {
    let name: String
    let body: () -> Void
    init(name: String, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}

/// The project's one way to start a thread: a plain joinable pthread named `name` (at most 15 bytes are
/// kept, the kernel's limit) with `stackSize` bytes of stack, or the system default when nil.
///
/// A dedicated OS thread rather than a Dispatch queue or `Foundation.Thread`: the event loops, the fetcher
/// and the store's writer block in epoll, curl and fsync, and must not sit on a shared pool.
/// The caller joins the returned thread with `pthread_join` (once) or lets it run for the process's life.
public func startThread(
    name: String, stackSize: Int? = nil, _ body: @escaping () -> Void
) throws(ThreadStartError) -> pthread_t {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if let stackSize {
        let rc = pthread_attr_setstacksize(&attributes, stackSize)
        guard rc == 0 else { throw ThreadStartError(call: "pthread_attr_setstacksize", errno: rc) }
    }
    let box = Unmanaged.passRetained(ThreadBody(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, &attributes, { argument in
        guard let argument else { return nil }
        let body = Unmanaged<ThreadBody>.fromOpaque(argument).takeRetainedValue()
        setCurrentThreadName(body.name)
        body.body()
        return nil
    }, box)
    guard rc == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
        throw ThreadStartError(call: "pthread_create", errno: rc)
    }
    return thread
}

/// Glibc's `pthread_setname_np` is declared only under `_GNU_SOURCE`, which the Swift Glibc module leaves out;
/// it is looked up once at run time instead. The name only helps `top -H`, gdb and sanitizer reports.
private let setName: (@convention(c) (pthread_t, UnsafePointer<CChar>) -> Int32)? = {
    #if canImport(Glibc)
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pthread_setname_np") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) (pthread_t, UnsafePointer<CChar>) -> Int32).self)
    #else
    return nil
    #endif
}()

private func setCurrentThreadName(_ name: String) {
    guard let setName else { return }
    // The kernel keeps 15 bytes and the terminating zero; a longer name is refused, not cut.
    var bytes = Array(name.utf8.prefix(15)).map { CChar(bitPattern: $0) }
    bytes.append(0)
    _ = setName(pthread_self(), bytes)
}
