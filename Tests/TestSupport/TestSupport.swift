/// Helpers shared by the test targets: the upstream fixture and a server on port 0.
public enum TestSupport {}
