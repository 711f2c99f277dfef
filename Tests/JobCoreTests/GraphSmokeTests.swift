import XCTest
@testable import JobCore

final class GraphSmokeTests: XCTestCase {
    func testApiExampleParses() throws {
        let text = #"""
        {"name":"profile-and-messages","graph":{"type":"list","fire_on_first_error":true,"children":[
          {"id":"profile","type":"fetch","url":"http://api.local/profile"},
          {"id":"messages","type":"fetch","url":"http://api.local/messages","retries":2}]},
         "deadline_ms":60000,"metadata":{"requested_by":"nightly-sync"}}
        """#
        let spec = try JobSpec.parse(try JSONValue.parse(text))
        XCTAssertEqual(spec.graph.nodes.map(\.id), ["root", "profile", "messages"])
    }
}
