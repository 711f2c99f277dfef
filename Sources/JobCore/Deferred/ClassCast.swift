/// `value as? T` for the two classes a Deferred's value is tested for (`Deferred`, `Failure`), told at once for the
/// values that flow through the engine's chains.
///
/// On Linux, with Foundation loaded, a cast of a Swift array, dictionary or string to a class type bridges it to its
/// NS counterpart first and only then fails: for a `DeferredList`'s `[Any?]` of n results, n boxes and an NSArray
/// at each link it passed (32 ms at 10,000 results, on the way from a list's last child to its job's answer). A
/// `JSONValue` (every node's result) and an `[Any?]` are never a class instance, so their type alone answers.
@inline(__always)
func classCast<T: AnyObject>(_ value: Any?, to _: T.Type) -> T? {
    guard let value else { return nil }
    let type = Swift.type(of: value)
    if type == JSONValue.self || type == [Any?].self { return nil }
    return value as? T
}

extension Failure {
    /// `value as? Failure`, without bridging (see `classCast`).
    @inline(__always)
    static func from(_ value: Any?) -> Failure? { classCast(value, to: Failure.self) }
}

extension Deferred {
    /// `value as? Deferred`, without bridging (see `classCast`).
    @inline(__always)
    static func from(_ value: Any?) -> Deferred? { classCast(value, to: Deferred.self) }
}
