import Foundation
import XCTest

@testable import JobServer

final class OpenAPISpecTests: XCTestCase {
    func testEmbeddedSpecEqualsOpenAPIYaml() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let file = try String(contentsOf: root.appendingPathComponent("openapi.yaml"), encoding: .utf8)
        XCTAssertTrue(
            openAPISpec == file,
            "Sources/JobServer/OpenAPISpec.swift is stale: run scripts/embed-openapi.sh")
    }
}
