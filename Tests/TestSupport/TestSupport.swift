import Foundation

/// Helpers shared by the test targets: the upstream fixture and a server on port 0.
public enum TestSupport {}

extension TestSupport {
    /// Polls `condition` every 20 ms until it holds or `seconds` have passed; whether it held.
    public static func eventually(_ seconds: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        for _ in 0..<10_000 {
            if try condition() { return true }
            if Date() > deadline { return false }
            usleep(20_000)
        }
        return false
    }
}
