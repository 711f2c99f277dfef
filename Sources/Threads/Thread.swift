#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
#if os(Linux)
import CThreadsLinux
#endif

/// Why a thread did not start: the `pthread_*` call and its error number.
public struct ThreadStartError: Error, CustomStringConvertible {
    public let call: String
    public let errno: Int32
    public var description: String { "\(call) failed (errno \(errno))" }
}

private final class ThreadBody {
    let name: String
    let nice: Int32?
    let sliceMicroseconds: Int?
    let body: () -> Void
    init(name: String, nice: Int32?, sliceMicroseconds: Int?, body: @escaping () -> Void) {
        self.name = name
        self.nice = nice
        self.sliceMicroseconds = sliceMicroseconds
        self.body = body
    }
}

/// The project's one way to start a thread: a plain joinable pthread named `name` (at most 15 bytes are
/// kept, the kernel's limit) with `stackSize` bytes of stack, or the system default when nil.
///
/// A dedicated OS thread rather than a Dispatch queue or `Foundation.Thread`: the event loops, the fetcher
/// and the store's writer block in epoll, curl and fsync, and must not sit on a shared pool.
/// The caller joins the returned thread with `pthread_join` (once) or lets it run for the process's life.
/// With `niceIncrement`, the thread runs that many nice steps below the thread that starts it (at most 19).
/// With `sliceMicroseconds`, it asks for that time slice (`requestCurrentThreadTimeSlice`).
public func startThread(
    name: String, stackSize: Int? = nil, niceIncrement: Int32 = 0, sliceMicroseconds: Int? = nil,
    _ body: @escaping () -> Void
) throws(ThreadStartError) -> pthread_t {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if let stackSize {
        let rc = pthread_attr_setstacksize(&attributes, stackSize)
        guard rc == 0 else { throw ThreadStartError(call: "pthread_attr_setstacksize", errno: rc) }
    }
    let nice = niceIncrement > 0 ? min(19, currentThreadNice() + niceIncrement) : nil
    let box = Unmanaged.passRetained(
        ThreadBody(name: name, nice: nice, sliceMicroseconds: sliceMicroseconds, body: body)
    ).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, &attributes, { argument in
        guard let argument else { return nil }
        let body = Unmanaged<ThreadBody>.fromOpaque(argument).takeRetainedValue()
        setCurrentThreadName(body.name)
        if let nice = body.nice { lowerCurrentThreadPriority(to: nice) }
        if let slice = body.sliceMicroseconds { requestCurrentThreadTimeSlice(microseconds: slice) }
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

/// The calling thread's nice value. On Linux, `PRIO_PROCESS` with 0 names the calling thread, not the process;
/// elsewhere it would name the process, so there the value is read as 0 and left alone.
public func currentThreadNice() -> Int32 {
    #if os(Linux)
    return getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
    #else
    return 0
    #endif
}

/// Raises the calling thread's nice value to `nice` if it is below; a failure leaves the thread as it was. An
/// unprivileged thread may raise its nice value but not lower it again, so this is for threads that keep it.
public func lowerCurrentThreadPriority(to nice: Int32) {
    #if os(Linux)
    if currentThreadNice() < nice {
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice)
    }
    #endif
}

// MARK: - Time slice

/// Asks the kernel to run the calling thread in slices of `microseconds` (Linux 6.12 and later clamp it to
/// 100 µs – 100 ms), keeping its class and nice value. Under the fair scheduler (EEVDF) a thread's deadline is its
/// slice after its eligible time, so a thread with a short slice runs sooner when it wakes among busy threads; its
/// share of the CPU is its nice value's as before. For threads that wake often and run briefly, such as an event
/// loop answering a request. Only a thread in the normal or batch class asks; a kernel without custom slices takes
/// the value and keeps its own (before 6.12), or refuses it: either way the thread runs on as it was. Returns
/// whether the kernel took the request.
@discardableResult
public func requestCurrentThreadTimeSlice(microseconds: Int) -> Bool {
    #if os(Linux)
    guard microseconds > 0, var attributes = currentSchedulingAttributes() else { return false }
    // SCHED_OTHER (0) and SCHED_BATCH (3): the fair classes a slice applies to.
    guard attributes.sched_policy == 0 || attributes.sched_policy == 3 else { return false }
    attributes.sched_flags = 0
    attributes.sched_runtime = UInt64(microseconds) * 1000
    return cthreads_set_attr(&attributes) == 0
    #else
    return false
    #endif
}

/// The calling thread's time slice in nanoseconds, as the kernel reports it (`sched_getattr`): the slice asked for
/// after `requestCurrentThreadTimeSlice` on a kernel that keeps it; `nil` where it cannot be read.
public func currentThreadTimeSliceNanoseconds() -> UInt64? {
    #if os(Linux)
    return currentSchedulingAttributes()?.sched_runtime
    #else
    return nil
    #endif
}

#if os(Linux)
/// The calling thread's scheduling attributes (`sched_getattr`); `nil` if the kernel will not say.
private func currentSchedulingAttributes() -> cthreads_sched_attr? {
    var attributes = cthreads_sched_attr()
    return cthreads_get_attr(&attributes) == 0 ? attributes : nil
}
#endif

// MARK: - Idle priority

/// A thread's id as the kernel knows it (Linux `gettid`), for setting another thread's priority; 0 elsewhere.
/// Glibc declares `gettid` only under `_GNU_SOURCE`, so it is looked up once at run time, like `pthread_setname_np`.
public func currentThreadID() -> Int32 {
    #if os(Linux)
    return getThreadID?() ?? 0
    #else
    return 0
    #endif
}

#if os(Linux)
private let getThreadID: (@convention(c) () -> Int32)? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "gettid") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) () -> Int32).self)
}()

/// Linux's `SCHED_IDLE` (`<linux/sched.h>`), which glibc declares only under `_GNU_SOURCE`.
private let schedIdle: Int32 = 5
#endif

/// Idle priority: Linux's `SCHED_IDLE` class, in which a thread runs on CPU time no other thread of the machine
/// wants (a weight of 3 against nice 0's 1,024), for work that nobody waits on while it is done.
///
/// Putting a thread there is always allowed; taking it back to the normal class at its nice value needs
/// `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows that nice value (`ulimit -e`, `docker run --ulimit nice=N`):
/// `IdlePriority.isReversible(atNice:)` says whether it does here, so that no thread is put there for good.
public enum IdlePriority {
    /// Puts thread `tid` (`currentThreadID()`) in the idle class (`idle`) or back in the normal one, keeping its
    /// nice value; false if the kernel refused or there is no such class here.
    @discardableResult
    public static func set(_ idle: Bool, thread tid: Int32) -> Bool {
        #if os(Linux)
        guard tid > 0 else { return false }
        var parameters = sched_param(sched_priority: 0)
        return sched_setscheduler(tid, idle ? schedIdle : SCHED_OTHER, &parameters) == 0
        #else
        return false
        #endif
    }

    /// Whether thread `tid` is in the idle class now.
    public static func isIdle(thread tid: Int32) -> Bool {
        #if os(Linux)
        return tid > 0 && sched_getscheduler(tid) == schedIdle
        #else
        return false
        #endif
    }

    /// Whether a thread at nice value `nice` may be put in the idle class and taken back out, tried on a thread
    /// started for it (a thread that could not come back would stay there).
    public static func isReversible(atNice nice: Int32) -> Bool {
        #if os(Linux)
        let works = Locked(false)
        do {
            let thread = try startThread(name: "idle-probe", stackSize: 256 << 10) {
                lowerCurrentThreadPriority(to: nice)
                let tid = currentThreadID()
                guard currentThreadNice() == nice, set(true, thread: tid) else { return }
                let back = set(false, thread: tid)
                works.withLock { $0 = back }
            }
            pthread_join(thread, nil)
        } catch {
            return false
        }
        return works.withLock { $0 }
        #else
        return false
        #endif
    }
}
