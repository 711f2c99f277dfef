import XCTest
@testable import JobCore

/// FIPS 180-4 examples, RFC 4231 HMAC cases, and digests Python's `hashlib` / `hmac` computed for this file.
final class SHA256Tests: XCTestCase {
    private func hex(_ bytes: [UInt8]) -> String { SHA256.hex(bytes) }

    func testFIPSExamples() {
        XCTAssertEqual(hex(SHA256.hash([UInt8]())), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        XCTAssertEqual(hex(SHA256.hash(Array("abc".utf8))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        XCTAssertEqual(
            hex(SHA256.hash(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        XCTAssertEqual(
            hex(SHA256.hash([UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    /// Lengths around the padding boundaries (55/56 bytes, one and two blocks).
    func testLengthsAroundThePaddingBoundary() {
        let expected: [Int: String] = [
            55: "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59",
            56: "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562",
            63: "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488",
            64: "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108",
            65: "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781",
            119: "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6",
            120: "f52b23db1fbb6ded89ef42a23ce0c8922c45f25c50b568a93bf1c075420bbb7c",
        ]
        for (n, digest) in expected {
            let bytes = (0..<n).map { UInt8($0) }
            XCTAssertEqual(hex(SHA256.hash(bytes)), digest, "length \(n)")
            // Fed in two uneven parts, the digest is the same.
            var split = SHA256()
            split.update(bytes.prefix(n / 3))
            split.update(bytes.dropFirst(n / 3))
            XCTAssertEqual(hex(split.finish()), digest, "length \(n) in two parts")
        }
    }

    func testHMACVectors() {
        // RFC 4231 test case 1.
        XCTAssertEqual(
            hex(SHA256.hmac(key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        // RFC 4231 test case 6: a key longer than the block is hashed first.
        XCTAssertEqual(
            hex(SHA256.hmac(key: [UInt8](repeating: 0xaa, count: 131),
                            message: Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        // hmac.new(b"s3cret", b'{"id":"x"}', hashlib.sha256).hexdigest()
        XCTAssertEqual(
            hex(SHA256.hmac(key: Array("s3cret".utf8), message: Array(#"{"id":"x"}"#.utf8))),
            "9f0beccf514841d21c56dba276089c2345c12d5d2deb19b4d22c873371e5e8b6")
    }
}
