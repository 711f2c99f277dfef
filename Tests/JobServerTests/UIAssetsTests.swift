import Foundation
import HTTPServer
import XCTest

@testable import JobServer

final class UIAssetsTests: XCTestCase {
    func testEmbeddedFilesEqualUIFolder() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let folder = root.appendingPathComponent("ui")
        let names = try FileManager.default.contentsOfDirectory(atPath: folder.path).sorted()
        XCTAssertEqual(names, uiAssets.keys.sorted(), "Sources/JobServer/UIAssets.swift is stale: run scripts/embed-ui.sh")
        for name in names {
            let text = try String(contentsOf: folder.appendingPathComponent(name), encoding: .utf8)
            XCTAssertTrue(uiAssets[name]?.text == text, "ui/\(name) changed: run scripts/embed-ui.sh")
        }
    }

    func testAnswersWithETagAndPolicyAnd304() throws {
        let index = try XCTUnwrap(uiAssets[UIRoutes.index])
        let first = UIRoutes.answer(name: UIRoutes.index, ifNoneMatch: nil)
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.headers["ETag"], index.etag)
        XCTAssertEqual(first.headers["Content-Type"], "text/html; charset=utf-8")
        XCTAssertTrue(first.headers["Content-Security-Policy"]?.contains("default-src 'self'") == true)
        let again = UIRoutes.answer(name: UIRoutes.index, ifNoneMatch: index.etag)
        XCTAssertEqual(again.status, 304)
        XCTAssertTrue(again.body.isEmpty)
        XCTAssertEqual(UIRoutes.answer(name: "nope.js", ifNoneMatch: nil).status, 404)
    }

    func testPageLoadsNothingFromAnotherOrigin() {
        // Job URLs in the example job are text; what the browser would load is a src, href, import or url().
        let loads = ["src=\"http", "src=\"//", "href=\"http", "href=\"//", "from \"http", "import(\"http", "url(http", "url(//"]
        for (name, asset) in uiAssets {
            for load in loads {
                XCTAssertFalse(asset.text.contains(load), "ui/\(name) loads from another origin: \(load)")
            }
        }
    }
}
