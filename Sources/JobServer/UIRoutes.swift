import HTTPServer
import JobCore

/// One file of the dashboard, embedded by scripts/embed-ui.sh.
struct UIAsset {
    var contentType: String
    /// A strong entity tag: the hash of the file's content.
    var etag: String
    var text: String
}

/// The dashboard at `/ui`: static files embedded in the binary, answered with an `ETag` and `304` on a match.
///
/// The files hold no job data, so they are served without the bearer token: the page asks for the token and sends
/// it on its own API requests, which `App` checks as usual.
enum UIRoutes {
    static let index = "index.html"

    /// The page's Content-Security-Policy: nothing from another origin, no inline script or style, no frames.
    static let contentSecurityPolicy =
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        + "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    /// Adds `GET /ui`, `GET /ui/` and `GET /ui/{file}` to `router`.
    static func add(to router: Router, logger: Logger, assets: [String: UIAsset] = uiAssets) {
        for pattern in ["/ui", "/ui/", "/ui/{file}"] {
            router.add("GET", pattern) { httpRequest, responder in
                let request = APIRequest(httpRequest)
                let exchange = Exchange(
                    request: request, logger: logger, deliver: { responder.send($0) },
                    registerOnClose: { responder.onClose = $0 })
                let name = request.pathParameters["file"] ?? index
                exchange.send(answer(name: name, ifNoneMatch: request.headers["If-None-Match"], assets: assets))
            }
        }
    }

    /// The answer for the file `name`: `200` with it, `304` when `ifNoneMatch` names its tag, `404` if there is none.
    static func answer(name: String, ifNoneMatch: String?, assets: [String: UIAsset] = uiAssets) -> HTTPResponse {
        guard let asset = assets[name] else {
            return App.error(404, "not_found", "no file \(name) in the dashboard")
        }
        var headers = HTTPHeaders([
            ("ETag", asset.etag),
            // Revalidated on every load, so a new binary's files are picked up at once; the ETag makes that a 304.
            ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", contentSecurityPolicy),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ])
        if App.ifNoneMatch(ifNoneMatch, matches: asset.etag) {
            return HTTPResponse(status: 304, headers: headers)
        }
        headers.set("Content-Type", asset.contentType)
        return HTTPResponse(status: 200, headers: headers, body: Array(asset.text.utf8))
    }
}
