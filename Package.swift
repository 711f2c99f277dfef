// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "jobserver",
    platforms: [.macOS(.v13)],
    products: [
        .executable(name: "jobserver", targets: ["JobServer"]),
        .executable(name: "HTTPBenchServer", targets: ["HTTPBenchServer"]),
        .library(name: "HTTPServer", targets: ["HTTPServer"]),
        .library(name: "JobCore", targets: ["JobCore"]),
    ],
    targets: [
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CPostgres",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .systemLibrary(name: "CHTTPLinux"),
        .systemLibrary(name: "CThreadsLinux"),
        // The one lock type and the one thread starter, shared by every module.
        .target(name: "Threads", dependencies: ["CThreadsLinux"]),
        .target(name: "HTTPServer", dependencies: ["CHTTPLinux", "Threads"]),
        .target(name: "JobCore", dependencies: ["CCurl", "CSQLite", "CPostgres", "Threads"], linkerSettings: [.linkedLibrary("m")]),
        .executableTarget(name: "JobServer", dependencies: ["HTTPServer", "JobCore", "CCurl", "Threads"]),
        .executableTarget(name: "FetchBench", dependencies: ["JobCore"], path: "bench/FetchBench"),
        .executableTarget(name: "ParseBench", dependencies: ["JobCore"], path: "bench/ParseBench"),
        .executableTarget(name: "HTTPBenchServer", dependencies: ["HTTPServer"], path: "bench/HTTPBenchServer"),
        .target(name: "TestSupport", dependencies: ["JobCore"], path: "Tests/TestSupport"),
        .testTarget(name: "ThreadsTests", dependencies: ["Threads"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer", "TestSupport", "Threads"]),
        .testTarget(name: "JobCoreTests", dependencies: ["JobCore", "TestSupport", "Threads"]),
        .testTarget(name: "JobServerTests", dependencies: ["JobServer", "HTTPServer", "JobCore", "TestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
