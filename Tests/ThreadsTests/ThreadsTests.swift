import Foundation
import Threads
import XCTest

final class ThreadsTests: XCTestCase {
    func testStartThreadRunsTheBodyUnderItsNameAndJoins() throws {
        let seen = Locked<String?>(nil)
        let thread = try startThread(name: "threads-test", stackSize: 512 * 1024) {
            let name = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
            seen.withLock { $0 = name?.trimmingCharacters(in: .whitespacesAndNewlines) }
        }
        XCTAssertEqual(pthread_join(thread, nil), 0)
        XCTAssertEqual(seen.withLock { $0 }, "threads-test")
    }

    func testALongNameIsCutToTheKernelsFifteenBytes() throws {
        let seen = Locked<String?>(nil)
        let thread = try startThread(name: "a-name-longer-than-fifteen-bytes") {
            let name = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
            seen.withLock { $0 = name?.trimmingCharacters(in: .whitespacesAndNewlines) }
        }
        XCTAssertEqual(pthread_join(thread, nil), 0)
        XCTAssertEqual(seen.withLock { $0 }, "a-name-longer-t")
    }

    func testANiceIncrementRunsTheThreadThatManyStepsBelowItsStarterAndNoLowerThanNineteen() throws {
        let starter = currentThreadNice()
        for increment: Int32 in [0, 3, 40] {
            let seen = Locked<Int32?>(nil)
            let thread = try startThread(name: "nice-\(increment)", niceIncrement: increment) {
                let nice = currentThreadNice()
                seen.withLock { $0 = nice }
            }
            XCTAssertEqual(pthread_join(thread, nil), 0)
            XCTAssertEqual(seen.withLock { $0 }, min(19, starter + increment), "increment \(increment)")
        }
        // Only the new thread moved.
        XCTAssertEqual(currentThreadNice(), starter)
    }

    func testAThreadPutAtIdlePriorityIsThereAndComesBackWithItsNiceValue() throws {
        try XCTSkipUnless(
            IdlePriority.isReversible(atNice: currentThreadNice()),
            "this user may not take a thread back from idle priority (needs CAP_SYS_NICE or ulimit -e)")
        let seen = Locked<[String]>([])
        let thread = try startThread(name: "idle-test", niceIncrement: 3) {
            let tid = currentThreadID()
            let nice = currentThreadNice()
            var steps: [String] = []
            steps.append("idle \(IdlePriority.isIdle(thread: tid))")
            steps.append("set idle \(IdlePriority.set(true, thread: tid)), idle \(IdlePriority.isIdle(thread: tid))")
            steps.append("set back \(IdlePriority.set(false, thread: tid)), idle \(IdlePriority.isIdle(thread: tid))")
            steps.append("same nice \(currentThreadNice() == nice)")
            seen.withLock { $0 = steps }
        }
        XCTAssertEqual(pthread_join(thread, nil), 0)
        XCTAssertEqual(
            seen.withLock { $0 },
            ["idle false", "set idle true, idle true", "set back true, idle false", "same nice true"])
        XCTAssertFalse(IdlePriority.isIdle(thread: currentThreadID()), "only that thread moved")
        XCTAssertFalse(IdlePriority.set(true, thread: 0), "no thread 0")
    }

    func testASliceAskedForIsTheThreadsOwnAndKeepsItsNiceValue() throws {
        try XCTSkipUnless(kernelKeepsCustomSlices(), "custom time slices need Linux 6.12 or later")
        let starterSlice = currentThreadTimeSliceNanoseconds()
        let starterNice = currentThreadNice()
        let seen = Locked<[String]>([])
        let thread = try startThread(name: "slice-test", niceIncrement: 3, sliceMicroseconds: 100) {
            var steps = ["slice \(currentThreadTimeSliceNanoseconds().map(String.init) ?? "unknown")"]
            steps.append("nice \(currentThreadNice() - starterNice)")
            steps.append("asked 2 ms \(requestCurrentThreadTimeSlice(microseconds: 2000))")
            steps.append("slice \(currentThreadTimeSliceNanoseconds().map(String.init) ?? "unknown")")
            steps.append("asked 0 \(requestCurrentThreadTimeSlice(microseconds: 0))")
            seen.withLock { $0 = steps }
        }
        XCTAssertEqual(pthread_join(thread, nil), 0)
        XCTAssertEqual(
            seen.withLock { $0 }, ["slice 100000", "nice 3", "asked 2 ms true", "slice 2000000", "asked 0 false"])
        XCTAssertEqual(currentThreadTimeSliceNanoseconds(), starterSlice, "only that thread moved")
    }

    /// Whether the running kernel keeps a thread's own slice (EEVDF custom slices, Linux 6.12).
    private func kernelKeepsCustomSlices() -> Bool {
        var names = utsname()
        uname(&names)
        let release = withUnsafeBytes(of: &names.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let parts = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        guard parts.count == 2 else { return false }
        return (parts[0], parts[1]) >= (6, 12)
    }

    func testAStackSizeTheSystemRefusesIsAnErrorNotACrash() {
        XCTAssertThrowsError(try startThread(name: "too-small", stackSize: 1) {}) { error in
            XCTAssertEqual((error as? ThreadStartError)?.call, "pthread_attr_setstacksize")
            XCTAssertEqual((error as? ThreadStartError)?.errno, EINVAL)
        }
    }

    func testLockedGivesEachThreadTheValueInTurn() throws {
        let counter = Locked(0)
        let rounds = 20_000
        let threads = try (0..<4).map { index in
            try startThread(name: "count-\(index)") {
                for _ in 0..<rounds { counter.withLock { $0 += 1 } }
            }
        }
        for thread in threads { XCTAssertEqual(pthread_join(thread, nil), 0) }
        XCTAssertEqual(counter.withLock { $0 }, 4 * rounds)
    }

    func testASignalWakesAWaiterAndATimedWaitReturnsWithoutOne() throws {
        let lock = Lock()
        var ready = false
        let thread = try startThread(name: "signaller") {
            lock.withLock {
                ready = true
                lock.signal()
            }
        }
        lock.lock()
        // Bounded: at most 100 waits of 100 ms, however the threads are scheduled.
        for _ in 0..<100 where !ready { lock.wait(milliseconds: 100) }
        let woke = ready
        lock.unlock()
        XCTAssertEqual(pthread_join(thread, nil), 0)
        XCTAssertTrue(woke)
        // Nobody signals: the timed wait returns on its own.
        lock.withLock { lock.wait(milliseconds: 1) }
    }

    func testAWatchedValueWakesItsWaiterOnTheChangeThatSatisfiesIt() throws {
        let steps = Watched(0)
        let thread = try startThread(name: "stepper") {
            for _ in 0..<3 { steps.withLock { $0 += 1 } }
        }
        // 10 s is only a bound: the waiter looks again at each change, and returns at the third.
        XCTAssertTrue(steps.wait(milliseconds: 10_000) { $0 == 3 })
        XCTAssertEqual(pthread_join(thread, nil), 0)
        // Already true: no wait at all. Never true: the answer comes when the time is up.
        XCTAssertTrue(steps.wait(milliseconds: 0) { $0 == 3 })
        XCTAssertFalse(steps.wait(milliseconds: 20) { $0 == 4 })
    }

    func testWaitForCompletionReturnsWhatTheCompletionWasGivenOnAnyThread() throws {
        // Called later, from another thread.
        let later = waitForCompletion { (done: @escaping @Sendable (Int) -> Void) in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { done(7) }
        }
        XCTAssertEqual(later, 7)
        // Called before `start` returns, on the waiting thread itself.
        let at = waitForCompletion { (done: @escaping @Sendable (String) -> Void) in done("now") }
        XCTAssertEqual(at, "now")
    }

    func testAdmissionRunsAtMostItsLimitAndTheRestInArrivalOrderAsPlacesAreReleased() {
        let admission = Admission(limit: 2)
        let started = Locked<[Int]>([])
        let releases = Locked<[Int: Admission.Release]>([:])
        for n in 0..<5 {
            admission.enter { release in
                started.withLock { $0.append(n) }
                releases.withLock { $0[n] = release }
            }
        }
        XCTAssertEqual(started.withLock { $0 }, [0, 1])
        XCTAssertEqual(admission.counts.inFlight, 2)
        XCTAssertEqual(admission.counts.waiting, 3)

        // A release lets the first waiting piece in, on the releasing thread; a second call of it does nothing.
        let first = releases.withLock { $0[1] }
        first?()
        first?()
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2])
        XCTAssertEqual(admission.counts.inFlight, 2)
        XCTAssertEqual(admission.counts.waiting, 2)

        // Released from other threads, the rest follow in arrival order; the count falls once none waits.
        for n in [0, 2, 3, 4] {
            let release = releases.withLock { $0[n] }
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                release?()
                done.signal()
            }
            done.wait()
        }
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2, 3, 4])
        XCTAssertEqual(admission.counts.inFlight, 0)
        XCTAssertEqual(admission.counts.waiting, 0)

        // With the count back at zero, work runs at once again.
        admission.enter { release in
            started.withLock { $0.append(5) }
            release()
        }
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2, 3, 4, 5])
        XCTAssertEqual(admission.counts.inFlight, 0)
    }

    func testWeightedAdmissionTakesWorkOnWhileItsWeightFitsAndAHeavierPieceAlone() {
        let admission = Admission(limit: 10, weightLimit: 10)
        let started = Locked<[Int]>([])
        let releases = Locked<[Int: Admission.Release]>([:])
        func enter(_ n: Int, weight: Int) {
            admission.enter(weight: weight) { release in
                started.withLock { $0.append(n) }
                releases.withLock { $0[n] = release }
            }
        }
        func release(_ n: Int) { releases.withLock { $0[n] }?() }

        enter(0, weight: 4)
        enter(1, weight: 6)
        enter(2, weight: 1)
        enter(3, weight: 25)
        enter(4, weight: 0)
        XCTAssertEqual(started.withLock { $0 }, [0, 1], "0 and 1 weigh 10 together; 2 would take it over")
        XCTAssertEqual(admission.weightInFlight, 10)
        XCTAssertEqual(admission.counts.waiting, 3)

        // 0 leaves: 2 fits, and 3, heavier than the limit, waits until nothing else is in flight; 4, light as it is,
        // waits behind it, in arrival order.
        release(0)
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2])
        XCTAssertEqual(admission.weightInFlight, 7)
        release(1)
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2])
        release(2)
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2, 3], "alone")
        XCTAssertEqual(admission.weightInFlight, 25)
        release(3)
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2, 3, 4])
        release(4)
        XCTAssertEqual(admission.weightInFlight, 0)
        XCTAssertEqual(admission.counts.inFlight, 0)

        // One release lets in every waiting piece that fits now, not just the first.
        enter(5, weight: 10)
        enter(6, weight: 3)
        enter(7, weight: 3)
        enter(8, weight: 3)
        XCTAssertEqual(started.withLock { $0 }.suffix(1), [5])
        release(5)
        XCTAssertEqual(started.withLock { $0 }.suffix(3), [6, 7, 8])
        XCTAssertEqual(admission.weightInFlight, 9)
        for n in 6...8 { release(n) }
        XCTAssertEqual(admission.counts.inFlight, 0)
    }

    func testWeightedAdmissionStillBoundsTheCount() {
        let admission = Admission(limit: 2, weightLimit: 100)
        let started = Locked<[Int]>([])
        let releases = Locked<[Int: Admission.Release]>([:])
        for n in 0..<3 {
            admission.enter(weight: 1) { release in
                started.withLock { $0.append(n) }
                releases.withLock { $0[n] = release }
            }
        }
        XCTAssertEqual(started.withLock { $0 }, [0, 1])
        releases.withLock { $0[0] }?()
        XCTAssertEqual(started.withLock { $0 }, [0, 1, 2])
    }
}
